#!/usr/bin/env python3
"""Writes the labelled corpus of agent tool-call traces (one JSON file per family).

The JSON files are the source of truth; this script is how they were first written, and
re-running it rewrites them identically (fixed seeds). Every trace's label, reason and
stop bounds are decided here, by what the agent is doing, never by what a detector does.

Labelling rules (the same for every family):

- A read-only call repeated with the same arguments and the same answer: the 3rd such call
  in a row (after two identical answers) is the earliest a detector may refuse; the 5th is
  the latest that still counts as in time (earliestStop + 2).
- A call that writes (a message sent, an issue filed, a refund created) repeated with the
  same arguments, each answer carrying only a fresh id: the 2nd identical write may be
  refused; it must be refused by the 3rd, so that at most two side effects happen.
- The same call failing with the same error: after 3 identical failures the 4th try may be
  refused; the 6th is the latest.
- A cycle of L different calls repeating with unchanged answers: the first call of the 3rd
  repetition may be refused (each of its calls is then the 3rd identical one); the last call
  of the 3rd repetition is the latest.
- Members that only carry per-call noise (request ids, nonces, idempotency keys, client
  timestamps) do not make calls different.
- Same arguments with a new answer is progress; retries spaced by a growing back-off are
  legitimate up to 5 attempts; a poll spaced by 30 s or more of a job known to take minutes
  is legitimate while it lasts.
"""

import json
import os
import random
import sys
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))

READ = "read-only"
WRITE = "writes"
CMD = "commands"


class Trace:
    def __init__(self, family, label, reason, seed):
        self.family = family
        self.label = label
        self.reason = reason
        self.calls = []
        self.tools = {}
        self.t = 0
        self.rng = random.Random(seed)
        self.earliest = None
        self.latest = None

    def gap(self, gap):
        if gap is None:
            gap = (1500, 6000)
        if isinstance(gap, tuple):
            return self.rng.randint(gap[0], gap[1])
        return gap

    def add(self, tool, risk, args, result=None, error=None, gap=None):
        """Appends one call and returns its index."""
        assert (result is None) != (error is None), tool
        if self.calls:
            self.t += self.gap(gap)
        if tool in self.tools:
            assert self.tools[tool]["risk"] == risk, tool
        self.tools[tool] = {"risk": risk}
        call = {"tool": tool, "args": args, "atMs": self.t}
        if error is not None:
            call["error"] = {"code": error[0], "message": error[1]}
        else:
            call["result"] = result
        self.calls.append(call)
        return len(self.calls) - 1

    def hexid(self, n=8):
        return "".join(self.rng.choice("0123456789abcdef") for _ in range(n))

    def stop(self, earliest, latest):
        self.earliest = earliest
        self.latest = latest


FAMILIES = {}


def family(name):
    def register(fn):
        FAMILIES[name] = fn
        return fn

    return register


def lines(prefix, start, n):
    return [f"{prefix} {i}" for i in range(start, start + n)]


# ---------------------------------------------------------------- pagination
@family("pagination")
def pagination():
    out = []
    # productive: same scroll args, new content each time
    for k, (site, sections) in enumerate(
        [
            ("docs.rs/tower", ["Service trait", "Layer trait", "ServiceBuilder", "timeout", "retry", "load shedding", "buffer", "limit"]),
            ("news.ycombinator.com", ["story 1-30", "story 31-60", "story 61-90", "story 91-120", "story 121-150", "story 151-180"]),
            ("en.wikipedia.org/wiki/Raft", ["Leader election", "Log replication", "Safety", "Membership changes", "Log compaction", "Implementations", "References"]),
        ]
    ):
        t = Trace("pagination", "productive", "", 100 + k)
        t.add("browser::navigate", READ, {"url": f"https://{site}"}, {"status": 200, "title": site})
        for s in sections:
            t.add("browser::scroll", READ, {"direction": "down", "pixels": 900}, {"visibleText": f"... {s} ...", "scrollY": 0})
        # scrollY grows with each scroll
        for i, c in enumerate(t.calls[1:]):
            c["result"]["scrollY"] = 900 * (i + 1)
        t.add("notes::append", WRITE, {"file": "notes.md", "text": f"Summary of {site}: {len(sections)} sections read"}, {"ok": True})
        t.reason = (f"Scrolls {site} with identical arguments, and every scroll shows a new section "
                    "and a larger scrollY: reading a long page, then writes the summary.")
        out.append(t)
    # productive: page numbers advance
    for k, (tool, key, total) in enumerate(
        [("shop::list_orders", "page", 9), ("github::list_issues", "page", 7), ("crm::list_contacts", "page", 11)]
    ):
        t = Trace("pagination", "productive", "", 110 + k)
        for p in range(1, total + 1):
            items = [f"{tool.split('::')[1][5:]}-{p * 50 + i}" for i in range(3)]
            args = {key: p, "per_page": 50}
            if tool == "github::list_issues":
                args["repo"] = "acme/api"
                args["state"] = "open"
            t.add(tool, READ, args, {"items": items, "page": p, "hasMore": p < total})
        t.reason = f"Walks {total} pages of {tool} with the page number increasing; every page returns different items until hasMore is false."
        out.append(t)
    # productive: cursors advance
    t = Trace("pagination", "productive", "", 120)
    cur = None
    for p in range(8):
        args = {"channel": "C02ENG", "limit": 100}
        if cur:
            args["cursor"] = cur
        cur = "dXNlcjpV" + t.hexid(6)
        t.add("slack::history", READ, args, {"messages": 100 if p < 7 else 37, "nextCursor": cur if p < 7 else None})
    t.reason = "Reads a Slack channel's history page by page, passing each answer's nextCursor to the next call; every call has new arguments."
    out.append(t)
    # productive: infinite feed, same args, new items; one unchanged answer at the end, then stops
    t = Trace("pagination", "productive", "", 121)
    for p in range(9):
        t.add("feed::next", READ, {"feed": "security-advisories", "count": 20},
              {"items": [f"GHSA-{p}{i}x-{t.hexid(4)}" for i in range(3)], "remaining": max(0, 160 - 20 * (p + 1))})
    last = t.calls[-1]["result"]
    t.add("feed::next", READ, {"feed": "security-advisories", "count": 20}, {"items": [], "remaining": 0})
    t.add("report::write", WRITE, {"path": "advisories.md", "count": 160}, {"ok": True})
    t.reason = "Drains a feed with identical calls, each returning new advisories and a smaller remainder; one empty answer ends it and the agent moves on."
    _ = last
    out.append(t)
    # loops: same page re-read unchanged
    specs = [
        ("shop::list_orders", {"page": 3, "per_page": 50}, {"items": ["order-151", "order-152", "order-153"], "page": 3, "hasMore": True}, 2,
         "Re-requests page 3 of the orders without ever moving to page 4; the answer is the same every time."),
        ("github::list_issues", {"repo": "acme/api", "state": "open", "page": 2, "per_page": 30},
         {"items": ["#231 flaky test", "#229 docs typo", "#226 retry storm"], "page": 2, "hasMore": True}, 1,
         "Keeps asking for issues page 2 with the same arguments and gets the same three issues each time."),
        ("browser::get_page", {"url": "https://status.example.com/incidents?page=1"},
         {"status": 200, "text": "No incidents reported today."}, 0,
         "Re-reads the same incidents page, which says the same thing every time, a few seconds apart."),
        ("crm::list_contacts", {"page": 5, "per_page": 25, "cursor": "c_5"},
         {"items": ["Ana Diaz", "Ben Okafor", "Chen Li"], "nextCursor": "c_6"}, 3,
         "Passes the same cursor again instead of the nextCursor it was given; the same page comes back each time."),
    ]
    for k, (tool, args, res, pre, why) in enumerate(specs):
        t = Trace("pagination", "loop", why, 130 + k)
        for p in range(pre):
            a = dict(args)
            if "page" in a:
                a["page"] = p + 1
            if "cursor" in a:
                a["cursor"] = f"c_{p + 1}"
            t.add(tool, READ, a, {"items": [f"item-{p}-{i}" for i in range(3)], "hasMore": True})
        first = t.add(tool, READ, args, res)
        for _ in range(6):
            t.add(tool, READ, args, res, gap=(1200, 4000))
        t.stop(first + 2, first + 4)
        out.append(t)
    # loops: scroll hits the bottom, keeps scrolling with the same answer
    for k, (site, n_new) in enumerate([("blog.example.com/postmortem", 4), ("forum.example.org/t/4411", 3)]):
        t = Trace("pagination", "loop", "", 140 + k)
        t.add("browser::navigate", READ, {"url": f"https://{site}"}, {"status": 200, "title": site})
        for i in range(n_new):
            t.add("browser::scroll", READ, {"direction": "down", "pixels": 900},
                  {"visibleText": f"... part {i + 1} ...", "scrollY": 900 * (i + 1), "atBottom": False})
        bottom = {"visibleText": "... Comments are closed. (c) 2024", "scrollY": 900 * (n_new + 1), "atBottom": True}
        b0 = t.add("browser::scroll", READ, {"direction": "down", "pixels": 900}, bottom)
        for _ in range(6):
            t.add("browser::scroll", READ, {"direction": "down", "pixels": 900}, bottom, gap=(800, 2500))
        t.reason = ("Scrolls to the bottom (atBottom true) and keeps scrolling: from then on every answer is the same. "
                    "The first bottom answer is new; the 2nd is the first unchanged one.")
        t.stop(b0 + 2, b0 + 4)
        out.append(t)
    return out


# ---------------------------------------------------------------- process output
@family("process_output")
def process_output():
    out = []
    # productive: process output grows
    builds = [
        ("process::read_output", READ, lambda pid: {"pid": pid}, "cargo build", ["Compiling serde", "Compiling tokio", "Compiling hyper", "Compiling tower", "Compiling app", "Finished release"]),
        ("process::read_output", READ, lambda pid: {"pid": pid, "stream": "stdout"}, "npm ci", ["added 120 packages", "added 410 packages", "added 980 packages", "audited 1203 packages", "found 0 vulnerabilities"]),
        ("shell::bash", CMD, lambda pid: {"command": "tail -n 20 /var/log/deploy/api.log"}, "deploy", ["pulling image", "image pulled", "starting container", "health check 1/3", "health check 2/3", "health check 3/3", "deploy done"]),
        ("shell::bash", CMD, lambda pid: {"command": "docker logs --tail 30 migrate-1"}, "migration", ["migration 001 applied", "migration 002 applied", "migration 003 applied", "migration 004 applied", "all migrations applied"]),
        ("terminal::read", READ, lambda pid: {"session": "t1"}, "pytest", ["collected 412 items", "tests/unit ....... [ 25%]", "tests/unit ....... [ 50%]", "tests/api ....... [ 75%]", "tests/e2e ....... [100%]", "412 passed in 81.2s"]),
    ]
    for k, (tool, risk, mk, what, steps) in enumerate(builds):
        t = Trace("process_output", "productive", "", 200 + k)
        pid = 4100 + k * 17
        if tool == "shell::bash":
            t.add(tool, risk, {"command": f"./scripts/{what}.sh &"}, {"exitCode": 0, "stdout": f"[1] {pid}"})
        else:
            t.add("process::start", CMD, {"command": what}, {"pid": pid})
        acc = []
        for s in steps:
            acc.append(s)
            t.add(tool, risk, mk(pid), {"stdout": "\n".join(acc[-3:]), "running": s != steps[-1]}, gap=(2000, 7000))
        t.reason = (f"Follows the output of {what} with the same call; every answer has new lines "
                    "until the process finishes.")
        out.append(t)
    # productive: output unchanged once, then moves on
    t = Trace("process_output", "productive", "", 206)
    t.add("process::start", CMD, {"command": "make test"}, {"pid": 912})
    seq = ["building", "building", "running 40 tests", "running 40 tests", "38 passed, 2 failed", "exit 2"]
    for s in seq:
        t.add("process::read_output", READ, {"pid": 912}, {"stdout": s, "running": s != "exit 2"}, gap=(3000, 6000))
    t.add("fs::read_file", READ, {"path": "target/test-report.txt"}, {"content": "2 failed: test_retry_budget, test_timeout"})
    t.reason = "Reads a test run's output; twice an answer repeats once (the process was busy), then it changes again; the agent stops when the process exits."
    out.append(t)
    # productive: queue drained, different messages each time
    for k, (queue, n) in enumerate([("emails-outbound", 6), ("image-jobs", 5)]):
        t = Trace("process_output", "productive", "", 207 + k)
        for i in range(n):
            mid = f"m-{t.hexid(6)}"
            t.add("queue::receive", READ, {"queue": queue, "max": 1}, {"messages": [{"id": mid, "body": f"job {i}"}]})
            t.add("queue::ack", WRITE, {"queue": queue, "id": mid}, {"ok": True})
        t.add("queue::receive", READ, {"queue": queue, "max": 1}, {"messages": []})
        t.reason = f"Drains the {queue} queue: the same receive call returns a new message each time, each acked by its own id; stops at the first empty answer."
        out.append(t)
    # productive: kubectl get pods through bash, statuses change
    t = Trace("process_output", "productive", "", 209)
    phases = ["0/3 Running", "1/3 Running", "1/3 Running", "2/3 Running", "3/3 Running"]
    t.add("shell::bash", CMD, {"command": "kubectl apply -f deploy.yaml"}, {"exitCode": 0, "stdout": "deployment.apps/api configured"})
    for ph in phases:
        t.add("shell::bash", CMD, {"command": "kubectl get pods -l app=api -n staging"}, {"exitCode": 0, "stdout": f"api ready {ph}"}, gap=(4000, 8000))
    t.add("shell::bash", CMD, {"command": "curl -s https://staging.example.com/healthz"}, {"exitCode": 0, "stdout": "ok"})
    t.reason = "Watches pods come up through a generic bash tool: the same command, with a readiness count that grows (one unchanged answer in between)."
    out.append(t)
    # loops: unchanged output re-read quickly
    loops = [
        ("process::read_output", READ, {"pid": 5521}, {"stdout": "Waiting for lock on build directory...", "running": True}, "process::start", {"command": "cargo build"}, {"pid": 5521},
         "The build is blocked on a lock and prints nothing new; the agent re-reads the same output every second or two."),
        ("shell::bash", CMD, {"command": "tail -n 5 /tmp/server.log"}, {"exitCode": 0, "stdout": "listening on :8080"}, "shell::bash", {"command": "./run-server.sh > /tmp/server.log 2>&1 &"}, {"exitCode": 0, "stdout": "[1] 7781"},
         "Re-reads the tail of a log that no longer changes (the server is up and idle), quickly and with the same command."),
        ("terminal::read", READ, {"session": "t2"}, {"screen": "Overwrite existing config? [y/N] "}, "terminal::write", {"session": "t2", "input": "./setup.sh\n"}, {"ok": True},
         "The program waits for an answer at a prompt; the agent keeps reading the unchanged screen instead of answering."),
        ("shell::bash", CMD, {"command": "cat /tmp/export/progress.txt"}, {"exitCode": 0, "stdout": "exported 0 rows"}, "shell::bash", {"command": "nohup ./export.sh &"}, {"exitCode": 0, "stdout": "nohup: ignoring input"},
         "The export never starts (the progress file stays at 0 rows); the agent cats it again and again every second."),
    ]
    for k, (tool, risk, args, res, st, sargs, sres, why) in enumerate(loops):
        t = Trace("process_output", "loop", why, 210 + k)
        t.add(st, CMD if st != "terminal::write" else WRITE, sargs, sres)
        first = t.add(tool, risk, args, res, gap=(1000, 3000))
        for _ in range(7):
            t.add(tool, risk, args, res, gap=(700, 2500))
        t.stop(first + 2, first + 4)
        out.append(t)
    # loops: queue drained, then empty receive again and again
    t = Trace("process_output", "loop", "", 214)
    for i in range(3):
        mid = f"m-{t.hexid(6)}"
        t.add("queue::receive", READ, {"queue": "webhooks", "max": 10}, {"messages": [{"id": mid}]})
        t.add("queue::ack", WRITE, {"queue": "webhooks", "id": mid}, {"ok": True})
    e0 = t.add("queue::receive", READ, {"queue": "webhooks", "max": 10}, {"messages": []})
    for _ in range(6):
        t.add("queue::receive", READ, {"queue": "webhooks", "max": 10}, {"messages": []}, gap=(500, 1500))
    t.stop(e0 + 2, e0 + 4)
    t.reason = "After draining the queue the agent keeps receiving from it within a second or so; every answer is the same empty list."
    out.append(t)
    t = Trace("process_output", "loop", "", 215)
    t.add("shell::bash", CMD, {"command": "docker compose up -d db"}, {"exitCode": 0, "stdout": "Container db-1 Started"})
    for i in range(2):
        t.add("shell::bash", CMD, {"command": "docker logs --tail 20 db-1"}, {"exitCode": 0, "stdout": f"init step {i + 1}"}, gap=(2000, 3000))
    s0 = t.add("shell::bash", CMD, {"command": "docker logs --tail 20 db-1"}, {"exitCode": 0, "stdout": "database system is ready to accept connections"}, gap=(2000, 3000))
    for _ in range(6):
        t.add("shell::bash", CMD, {"command": "docker logs --tail 20 db-1"}, {"exitCode": 0, "stdout": "database system is ready to accept connections"}, gap=(900, 2000))
    t.stop(s0 + 2, s0 + 4)
    t.reason = "The log shows progress, then the database is ready and the log stops changing; the agent keeps reading the same tail within seconds."
    out.append(t)
    return out


# ---------------------------------------------------------------- polling (status moves / tight polls)
@family("polling")
def polling():
    out = []
    moving = [
        ("ci::get_run", {"run_id": 88121}, ["queued", "in_progress 1/5", "in_progress 2/5", "in_progress 3/5", "in_progress 4/5", "in_progress 5/5", "completed success"], (5000, 9000)),
        ("jobs::status", {"job_id": "imp-7f3a"}, ["running 5%", "running 18%", "running 33%", "running 47%", "running 62%", "running 80%", "running 95%", "done"], (4000, 8000)),
        ("deploy::status", {"deployment": "api-2024-06-12"}, ["pending", "rolling 1/4", "rolling 1/4", "rolling 2/4", "rolling 3/4", "rolling 3/4", "rolling 4/4", "healthy"], (5000, 10000)),
        ("k8s::rollout_status", {"namespace": "prod", "deployment": "web"}, ["0 of 6 updated", "2 of 6 updated", "3 of 6 updated", "5 of 6 updated", "6 of 6 updated, 4 available", "6 of 6 available"], (3000, 7000)),
        ("cloud::get_operation", {"name": "operations/snapshot-3391"}, ["RUNNING 10%", "RUNNING 30%", "RUNNING 50%", "RUNNING 70%", "RUNNING 90%", "DONE"], (6000, 10000)),
        ("shell::bash", {"command": "gh run view 7781 --json status,conclusion,jobs -q '.jobs[].status'"}, ["queued queued", "in_progress queued", "completed in_progress", "completed in_progress", "completed completed"], (6000, 12000)),
    ]
    for k, (tool, args, states, gap) in enumerate(moving):
        risk = CMD if tool == "shell::bash" else READ
        t = Trace("polling", "productive", "", 300 + k)
        t.add("vcs::push" if k % 2 == 0 else "jobs::start", WRITE, {"ref": "main"} if k % 2 == 0 else {"kind": "refresh"}, {"ok": True})
        for s in states:
            t.add(tool, risk, args, {"status": s}, gap=gap)
        t.add("notes::append", WRITE, {"file": "log.md", "text": f"{tool} finished: {states[-1]}"}, {"ok": True})
        t.reason = f"Polls {tool} every few seconds; its status moves ({states[0]} to {states[-1]}), at most two identical answers in a row."
        out.append(t)
    tight = [
        ("jobs::status", {"job_id": "exp-19b2"}, {"status": "running", "progress": None}, (800, 1300), "Polls a running job about once a second; the answer never changes."),
        ("ci::get_run", {"run_id": 90312}, {"status": "queued"}, (1000, 2000), "Asks every 1-2 s for a CI run that stays queued; each answer is identical."),
        ("deploy::status", {"deployment": "web-canary"}, {"status": "pending", "reason": "waiting for approval"}, (600, 1200), "Polls a deployment that waits for a human approval, sub-second; it cannot move until someone approves."),
        ("payments::get_refund", {"refund_id": "re_3NfQ2k"}, {"status": "processing"}, (1500, 2500), "Checks a refund every two seconds; card refunds take days, the answer stays 'processing'."),
        ("jobs::status", {"job_id": "etl-nightly"}, {"status": "failed", "error": "disk full"}, (2000, 4000), "Keeps polling a job that already failed; a failed job's status does not change."),
        ("shell::bash", {"command": "kubectl get pod api-0 -o jsonpath='{.status.phase}'"}, {"exitCode": 0, "stdout": "Pending"}, (900, 1500), "Checks a pod's phase through bash every second; it stays Pending (unschedulable), same output each time."),
    ]
    for k, (tool, args, res, gap, why) in enumerate(tight):
        risk = CMD if tool == "shell::bash" else READ
        t = Trace("polling", "loop", why, 310 + k)
        t.add("jobs::start" if tool == "jobs::status" else "notes::read", WRITE if tool == "jobs::status" else READ,
              {"kind": "export"} if tool == "jobs::status" else {"file": "runbook.md"}, {"ok": True})
        first = t.add(tool, risk, args, res, gap=gap)
        for _ in range(10):
            t.add(tool, risk, args, res, gap=gap)
        t.stop(first + 2, first + 4)
        out.append(t)
    return out


# ---------------------------------------------------------------- long polls (patient, spaced out)
@family("long_poll")
def long_poll():
    out = []
    specs = [
        ("ci::get_run", {"run_id": 77001}, {"status": "in_progress"}, {"status": "completed", "conclusion": "success"}, 30000, 7 * 60, "the full CI pipeline"),
        ("db::export_status", {"export_id": "exp_2291"}, {"state": "EXPORTING"}, {"state": "DONE", "uri": "s3://exports/2291.csv.gz"}, 45000, 6 * 60, "a 40 GB table export"),
        ("ml::get_training_job", {"job": "ft-llama-3b-0612"}, {"state": "training"}, {"state": "succeeded", "model": "ft:3b:0612"}, 60000, 8 * 60, "a fine-tuning job"),
        ("cloud::get_operation", {"name": "operations/db-restore-812"}, {"done": False}, {"done": True, "response": {"restored": True}}, 30000, 6 * 60, "a database restore"),
        ("shell::bash", {"command": "gh run view 99120 --json status -q .status"}, {"exitCode": 0, "stdout": "in_progress"}, {"exitCode": 0, "stdout": "completed"}, 30000, 7 * 60, "a release workflow (through bash)"),
        ("video::render_status", {"render_id": "rnd-4410"}, {"status": "rendering"}, {"status": "ready", "url": "https://cdn.example.com/rnd-4410.mp4"}, 40000, 6 * 60, "a video render"),
        ("dns::check_propagation", {"name": "api.example.com", "type": "A"}, {"propagated": False, "resolvers": "3/12"}, {"propagated": True, "resolvers": "12/12"}, 30000, 7 * 60, "DNS propagation after a record change"),
    ]
    for k, (tool, args, mid, done, every, total, what) in enumerate(specs):
        risk = CMD if tool == "shell::bash" else READ
        t = Trace("long_poll", "productive", "", 400 + k)
        t.add("ops::start", WRITE, {"what": what}, {"ok": True, "eta": f"{total // 60} min"})
        n = total * 1000 // every
        for _ in range(n):
            t.add(tool, risk, args, mid, gap=(every - 2000, every + 2000))
        t.add(tool, risk, args, done, gap=(every - 2000, every + 2000))
        t.add("chat::reply", WRITE, {"text": f"{what} finished"}, {"ok": True})
        t.reason = (f"Waits for {what}, announced to take about {total // 60} minutes, polling every {every // 1000} s; "
                    "the answer stays the same until the job is done, then the agent reports. Patient, spaced polling.")
        out.append(t)
    return out


# ---------------------------------------------------------------- writes repeated
@family("write_repeat")
def write_repeat():
    out = []
    loops = [
        ("mail::send", {"to": "ops@acme.io", "subject": "Weekly uptime report", "body": "Uptime 99.97%, 1 incident (INC-311)."}, lambda t: {"messageId": f"<{t.hexid(12)}@mail.acme.io>", "status": "sent"},
         (20000, 60000), "Sends the same weekly report to the same address again and again; each answer only carries a fresh message id."),
        ("github::create_issue", {"repo": "acme/api", "title": "Retry storm when upstream returns 503", "body": "Seen in prod at 14:02 UTC..."}, lambda t: {"number": 400 + t.rng.randint(0, 50), "url": "https://github.com/acme/api/issues/" + str(400 + t.rng.randint(0, 50))},
         (15000, 50000), "Files the same issue (same title and body) repeatedly; each answer is a new issue number."),
        ("slack::post_message", {"channel": "#deploys", "text": "Deploy of api v2.14.0 to prod finished"}, lambda t: {"ok": True, "ts": f"17182{t.rng.randint(10000, 99999)}.00{t.rng.randint(1000, 9999)}"},
         (5000, 20000), "Posts the same deploy announcement to the same channel repeatedly; each answer has a new message ts."),
        ("payments::create_refund", {"charge": "ch_3PJx8a", "amount": 4900, "currency": "eur", "reason": "duplicate"}, lambda t: {"refund": f"re_{t.hexid(10)}", "status": "pending"},
         (4000, 15000), "Creates the same refund for the same charge again; every call is a new refund id, i.e. money paid out again."),
        ("calendar::create_event", {"title": "Postmortem INC-311", "start": "2024-06-14T15:00:00Z", "durationMin": 45, "attendees": ["sre@acme.io"]}, lambda t: {"eventId": t.hexid(16)},
         (8000, 30000), "Creates the same calendar event again and again; each answer is a new event id (duplicate invites)."),
        ("sms::send", {"to": "+4915112345678", "text": "Your verification code is 482913"}, lambda t: {"sid": f"SM{t.hexid(16)}"},
         (3000, 9000), "Sends the same SMS to the same number repeatedly; each answer a new SID."),
    ]
    for k, (tool, args, mk, gap, why) in enumerate(loops):
        t = Trace("write_repeat", "loop", why, 500 + k)
        if k % 2 == 0:
            t.add("docs::read", READ, {"path": "runbooks/reporting.md"}, {"content": "Send the report once per week."})
        s0 = t.add(tool, WRITE, args, mk(t))
        s1 = t.add(tool, WRITE, args, mk(t), gap=gap)
        s2 = t.add(tool, WRITE, args, mk(t), gap=gap)
        for _ in range(3):
            t.add(tool, WRITE, args, mk(t), gap=gap)
        _ = s0
        t.stop(s1, s2)
        out.append(t)
    # loop: create, search finds nothing (index lag), create again
    t = Trace("write_repeat", "loop", "", 506)
    ids = []
    for i in range(4):
        t.add("jira::search", READ, {"jql": "summary ~ \"Rotate TLS certificate for api.acme.io\""}, {"issues": []})
        ids.append(t.add("jira::create_ticket", WRITE, {"project": "OPS", "summary": "Rotate TLS certificate for api.acme.io", "type": "Task"}, {"key": f"OPS-{812 + i}"}, gap=(2000, 5000)))
    t.stop(ids[1], ids[2])
    t.reason = ("Searches for a ticket, the search index lags and finds nothing, so the agent creates the same ticket again; "
                "each create answers a new key. The 2nd create is a duplicate side effect.")
    out.append(t)
    # loop: gh issue create through bash
    t = Trace("write_repeat", "loop", "", 507)
    t.add("shell::bash", CMD, {"command": "git log --oneline -3"}, {"exitCode": 0, "stdout": "a1b2c3d fix retry\n9f8e7d6 bump deps\n1234abc init"})
    cmd = {"command": "gh issue create --repo acme/web --title 'Broken link on pricing page' --body 'The Contact sales link 404s.'"}
    sends = []
    for i in range(5):
        sends.append(t.add("shell::bash", CMD, cmd, {"exitCode": 0, "stdout": f"https://github.com/acme/web/issues/{1201 + i}"}, gap=(6000, 20000)))
    t.stop(sends[1], sends[2])
    t.reason = "Runs the same `gh issue create` command through bash again and again; each run files a new issue (new URL)."
    out.append(t)
    # loop: spaced minutes apart (outside a 120 s window)
    t = Trace("write_repeat", "loop", "", 508)
    sends = []
    for i in range(4):
        sends.append(t.add("mail::send", WRITE, {"to": "billing@customer.example", "subject": "Invoice INV-2291", "body": "Please find attached invoice INV-2291.", "attachments": ["INV-2291.pdf"]},
                           {"messageId": f"<{t.hexid(12)}@mail.acme.io>", "status": "sent"}, gap=(150000, 170000)))
        t.add("mail::list_sent", READ, {"limit": 1}, {"messages": [{"subject": "Invoice INV-2291"}]}, gap=(3000, 6000))
    t.stop(sends[1], sends[2])
    t.reason = ("Sends the same invoice to the same customer about every 2.5 minutes, each time after checking the sent folder "
                "that already shows it: a duplicate side effect each time, even though the sends are more than 120 s apart.")
    out.append(t)
    # productive look-alikes
    t = Trace("write_repeat", "productive", "", 520)
    for name in ["ana", "ben", "chen", "dara", "eli", "fay"]:
        t.add("mail::send", WRITE, {"to": f"{name}@customer.example", "subject": "Scheduled maintenance on June 20", "body": f"Hi {name.title()}, ..."}, {"messageId": f"<{t.hexid(12)}@mail.acme.io>"}, gap=(1500, 4000))
    t.reason = "Sends the same announcement to six different recipients: every send has a different address."
    out.append(t)
    t = Trace("write_repeat", "productive", "", 521)
    for i, title in enumerate(["Timeout not applied to streaming calls", "Retry ignores Retry-After", "Breaker metrics missing label", "Docs: wrong default TTL", "MCP adapter drops request id"]):
        t.add("github::search_issues", READ, {"repo": "acme/api", "q": title}, {"issues": []})
        t.add("github::create_issue", WRITE, {"repo": "acme/api", "title": title, "body": f"Found during audit, item {i + 1}."}, {"number": 500 + i})
    t.reason = "Files five different issues found in an audit, each after checking it does not exist yet."
    out.append(t)
    t = Trace("write_repeat", "productive", "", 522)
    for step in ["Starting migration of users table", "Copied 1/3 of rows", "Copied 2/3 of rows", "Copied all rows, verifying", "Verification passed", "Migration complete"]:
        t.add("db::run_step", CMD, {"step": step.split()[0].lower()}, {"ok": True}, gap=(5000, 15000))
        t.add("slack::post_message", WRITE, {"channel": "#migrations", "text": step}, {"ok": True, "ts": f"1718{t.rng.randint(100000, 999999)}.0001"})
    t.reason = "Posts progress updates to the same channel; each message has a different text."
    out.append(t)
    t = Trace("write_repeat", "productive", "", 523)
    t.add("mail::draft", WRITE, {"to": "legal@acme.io", "subject": "Contract renewal"}, {"draftId": "d-71"})
    args = {"to": "legal@acme.io", "subject": "Contract renewal", "body": "Attached the renewed contract.", "attachments": ["contract-2024.pdf"]}
    t.add("mail::send", WRITE, args, error=("UPSTREAM_UNAVAILABLE", "SMTP relay unavailable (421)"))
    t.add("mail::send", WRITE, args, {"messageId": "<a81f@mail.acme.io>", "status": "sent"}, gap=(4000, 8000))
    t.add("mail::list_sent", READ, {"limit": 1}, {"messages": [{"subject": "Contract renewal"}]})
    t.add("crm::log_activity", WRITE, {"account": "ACME-44", "note": "renewal sent"}, {"ok": True})
    t.add("chat::reply", WRITE, {"text": "Sent the renewal to legal."}, {"ok": True})
    t.reason = "The first send fails (relay unavailable, nothing sent) and one retry succeeds: one side effect in all."
    out.append(t)
    t = Trace("write_repeat", "productive", "", 524)
    for d in ["2024-06-17", "2024-06-18", "2024-06-19", "2024-06-20", "2024-06-21"]:
        t.add("calendar::create_event", WRITE, {"title": "Standup", "start": f"{d}T09:30:00Z", "durationMin": 15, "attendees": ["team@acme.io"]}, {"eventId": t.hexid(16)})
    t.add("chat::reply", WRITE, {"text": "Created standups for next week."}, {"ok": True})
    t.reason = "Creates one standup per day of next week: the start date differs on every call."
    out.append(t)
    t = Trace("write_repeat", "productive", "", 525)
    for pr in [412, 415, 418, 419, 423, 427]:
        t.add("github::get_pr", READ, {"repo": "acme/web", "number": pr}, {"title": f"PR {pr}", "checks": "passing"})
        t.add("github::add_comment", WRITE, {"repo": "acme/web", "number": pr, "body": "LGTM after rebase, merging tomorrow."}, {"id": t.rng.randint(10 ** 8, 10 ** 9)})
    t.reason = "Leaves the same review comment on six different pull requests: the PR number differs each time."
    out.append(t)
    return out


# ---------------------------------------------------------------- cycles
CYCLE_LOOPS = {
    2: [
        ([("fs::read_file", READ, {"path": "src/retry.rs"}, {"content": "fn backoff(attempt: u32) -> Duration { ... }"}),
          ("tests::run", CMD, {"filter": "retry"}, {"passed": 11, "failed": 1, "failures": ["retry::jitter_bounds"]})],
         "Reads the same file and runs the same tests in turn, changing nothing; the test fails the same way each time."),
        ([("web::search", READ, {"q": "tokio paused time sleep"}, {"hits": ["docs.rs/tokio/time/fn.pause", "github.com/tokio-rs/tokio/issues/3709"]}),
          ("web::fetch", READ, {"url": "https://docs.rs/tokio/latest/tokio/time/fn.pause.html"}, {"status": 200, "text": "Pauses time..."})],
         "Searches the same query and fetches the same page over and over."),
        ([("db::query", READ, {"sql": "SELECT count(*) FROM orders WHERE status='stuck'"}, {"rows": [[17]]}),
          ("db::describe_table", READ, {"table": "orders"}, {"columns": ["id", "status", "updated_at"]})],
         "Alternates the same count query and the same table description; nothing changes between rounds."),
    ],
    3: [
        ([("git::status", READ, {}, {"clean": False, "modified": ["src/lib.rs"]}),
          ("git::diff", READ, {"path": "src/lib.rs"}, {"diff": "+use std::fmt;"}),
          ("shell::bash", CMD, {"command": "cargo build"}, {"exitCode": 101, "stderr": "error[E0432]: unresolved import `crate::util`"})],
         "status, diff, build; the build fails with the same error every round and the agent edits nothing."),
        ([("browser::navigate", READ, {"url": "https://admin.example.com/settings"}, {"status": 200}),
          ("browser::screenshot", READ, {}, {"image": "sha256:5b1e"}),
          ("browser::click", WRITE, {"selector": "#save"}, {"clicked": True, "toast": "Nothing to save"})],
         "Navigates, screenshots and clicks Save on the same settings page; the page and the toast are the same every round."),
        ([("k8s::get_pods", READ, {"namespace": "prod"}, {"pods": ["api-0 CrashLoopBackOff"]}),
          ("k8s::logs", READ, {"pod": "api-0", "tail": 50}, {"text": "panic: missing env DATABASE_URL"}),
          ("k8s::describe_pod", READ, {"pod": "api-0"}, {"events": ["Back-off restarting failed container"]})],
         "Looks at the same crashing pod in the same three ways, round after round, without acting on the missing variable."),
    ],
    4: [
        ([("fs::list_dir", READ, {"path": "src/loop"}, {"entries": ["mod.rs", "detector.rs"]}),
          ("fs::read_file", READ, {"path": "src/loop/detector.rs"}, {"content": "pub fn check(..)"}),
          ("code::search", READ, {"q": "fn check("}, {"hits": ["src/loop/detector.rs:41"]}),
          ("tests::run", CMD, {"filter": "loop"}, {"passed": 30, "failed": 2})],
         "Lists, reads, searches and tests the same things in a 4-call round; every answer repeats."),
        ([("jira::search", READ, {"jql": "project=OPS AND text~'TLS'"}, {"issues": ["OPS-812"]}),
          ("jira::get_issue", READ, {"key": "OPS-812"}, {"status": "Open"}),
          ("wiki::search", READ, {"q": "TLS rotation"}, {"pages": ["Runbook: TLS"]}),
          ("wiki::get_page", READ, {"title": "Runbook: TLS"}, {"text": "Use certbot renew ..."})],
         "Goes around the same four lookups (ticket search, ticket, wiki search, wiki page), none of which changes."),
        ([("metrics::query", READ, {"expr": "rate(http_errors_total[5m])"}, {"value": 0.42}),
          ("logs::search", READ, {"q": "status=500", "range": "15m"}, {"count": 118}),
          ("traces::search", READ, {"service": "api", "error": True}, {"traces": 40}),
          ("dash::get_panel", READ, {"id": "api-errors"}, {"image": "sha256:aa01"})],
         "Cycles through the same four observability queries with identical answers, never narrowing down."),
    ],
    5: [
        ([("fs::read_file", READ, {"path": "config/app.yaml"}, {"content": "port: 8080"}),
          ("shell::bash", CMD, {"command": "./bin/app --check"}, {"exitCode": 1, "stderr": "port in use"}),
          ("shell::bash", CMD, {"command": "lsof -i :8080"}, {"exitCode": 0, "stdout": "node 4411"}),
          ("fs::read_file", READ, {"path": "README.md"}, {"content": "Run ./bin/app"}),
          ("web::search", READ, {"q": "address already in use 8080"}, {"hits": ["so/q/1", "so/q/2"]})],
         "A 5-call debugging round (config, check, lsof, README, search) repeated with the same answers; the agent never stops the process on the port."),
        ([("crm::get_account", READ, {"id": "ACME-44"}, {"plan": "pro"}),
          ("billing::get_invoice", READ, {"id": "INV-2291"}, {"status": "unpaid"}),
          ("billing::list_payments", READ, {"account": "ACME-44"}, {"payments": []}),
          ("mail::search", READ, {"q": "INV-2291"}, {"messages": 2}),
          ("crm::get_notes", READ, {"account": "ACME-44"}, {"notes": ["called 06-10"]})],
         "Reviews the same account in the same five lookups, round after round, with unchanged answers."),
        ([("web::fetch", READ, {"url": "https://example.com/pricing"}, {"status": 200, "text": "Pro: 49/mo"}),
          ("web::fetch", READ, {"url": "https://example.com/terms"}, {"status": 200, "text": "Terms..."}),
          ("notes::read", READ, {"file": "research.md"}, {"content": "pricing: ?"}),
          ("web::search", READ, {"q": "example.com enterprise pricing"}, {"hits": ["example.com/pricing"]}),
          ("web::fetch", READ, {"url": "https://example.com/contact"}, {"status": 200, "text": "Contact sales"})],
         "Fetches the same three pages, reads the same notes and runs the same search, in the same order, again and again."),
    ],
}


@family("cycles")
def cycles():
    out = []
    n = 0
    for length, specs in CYCLE_LOOPS.items():
        for calls, why in specs:
            t = Trace("cycles", "loop", "", 600 + n)
            n += 1
            pre = 1 + (n % 3)
            for i in range(pre):
                t.add("fs::read_file", READ, {"path": f"docs/context-{i}.md"}, {"content": f"context {i}"})
            start = len(t.calls)
            reps = 4 if length <= 4 else 4
            while len(t.calls) + length <= min(25, pre + reps * length):
                for tool, risk, args, res in calls:
                    t.add(tool, risk, args, res, gap=(1500, 4000))
            t.stop(start + 2 * length, start + 3 * length - 1)
            t.reason = (f"A cycle of {length} calls repeating with unchanged answers. {why} "
                        "The first call of the 3rd round is each call's 3rd identical run.")
            out.append(t)
    # productive cycles: progress each round
    t = Trace("cycles", "productive", "", 650)
    fails = [5, 3, 3, 1, 0]
    for i, f in enumerate(fails):
        t.add("fs::edit_file", WRITE, {"path": "src/parser.rs", "old": f"line {10 + i}", "new": f"fixed line {10 + i}"}, {"ok": True})
        t.add("tests::run", CMD, {"filter": "parser"}, {"passed": 20 - f, "failed": f})
    t.reason = "Edit then test, alternating; every edit changes a different line and the failing count moves (5, 3, 3, 1, 0)."
    out.append(t)
    t = Trace("cycles", "productive", "", 651)
    for i, (f, r) in enumerate([("src/a.rs", 4), ("src/b.rs", 2), ("src/c.rs", 1), ("src/d.rs", 0)]):
        t.add("fs::read_file", READ, {"path": f}, {"content": f"// {f}"})
        t.add("fs::edit_file", WRITE, {"path": f, "old": "unwrap()", "new": "?"}, {"ok": True})
        t.add("tests::run", CMD, {}, {"failed": r})
    t.reason = "A read/edit/test round per file; the file differs each round and the failures go down."
    out.append(t)
    t = Trace("cycles", "productive", "", 652)
    for p in range(1, 9):
        t.add("browser::navigate", READ, {"url": f"https://shop.example.com/catalog?page={p}"}, {"status": 200})
        t.add("browser::extract", READ, {"selector": ".product"}, {"products": [f"p{p}-{i}" for i in range(3)]})
    t.reason = "Navigate then extract, per catalog page: the URL changes each round and so do the products extracted with the same selector."
    out.append(t)
    t = Trace("cycles", "productive", "", 653)
    for br in ["feat/a", "feat/b", "feat/c", "fix/d"]:
        t.add("git::checkout", WRITE, {"branch": br}, {"ok": True})
        t.add("shell::bash", CMD, {"command": "cargo build --release"}, {"exitCode": 0, "stdout": f"built {br}"})
        t.add("bench::run", CMD, {"name": "throughput"}, {"opsPerSec": t.rng.randint(9000, 13000)})
        t.add("notes::append", WRITE, {"file": "bench.md", "text": f"{br}"}, {"ok": True})
    t.reason = "A 4-call round per branch (checkout, build, bench, note): the branch differs each round, so do the build and bench results."
    out.append(t)
    t = Trace("cycles", "productive", "", 654)
    for i in range(7):
        t.add("browser::click", WRITE, {"selector": "button.next-slide"}, {"clicked": True})
        t.add("browser::get_text", READ, {"selector": "main"}, {"text": f"Slide {i + 2}: " + ["Intro", "Setup", "Layers", "Retry", "Breaker", "Timeouts", "Summary", "End"][i + 1]})
    t.reason = "Clicks Next and reads the slide, both with the same arguments each round; the slide text changes every time (going through a deck)."
    out.append(t)
    t = Trace("cycles", "productive", "", 655)
    qs = ["tower retry budget", "tower retry budget example", "tower::retry::budget::TpsBudget", "TpsBudget deposit withdraw"]
    for q in qs:
        t.add("web::search", READ, {"q": q}, {"hits": [f"{q[:8]}-{i}" for i in range(2)]})
        t.add("web::fetch", READ, {"url": f"https://docs.rs/tower/search?q={q.replace(' ', '+')}"}, {"status": 200})
        t.add("notes::append", WRITE, {"file": "notes.md", "text": f"on {q}"}, {"ok": True})
    t.reason = "Search, fetch, note, with a refined query each round: every call's arguments differ from the previous round."
    out.append(t)
    t = Trace("cycles", "productive", "", 656)
    for i, q in enumerate([12, 9, 9, 4, 2, 0]):
        t.add("tests::run", CMD, {"suite": "e2e"}, {"failed": q})
        if q:
            t.add("fs::edit_file", WRITE, {"path": f"tests/e2e/case_{i}.rs", "old": "sleep(1)", "new": "wait_for_ready()"}, {"ok": True})
    t.reason = "The same test command alternates with edits of different files; the failing count falls to 0 (one unchanged count in between)."
    out.append(t)
    return out


# ---------------------------------------------------------------- per-call noise
@family("noise")
def noise():
    out = []
    reads = [
        ("web::search", lambda t: {"q": "rust tower timeout layer example", "request_id": t.hexid(8) + "-" + t.hexid(4)}, {"hits": ["docs.rs/tower/timeout", "github.com/tower-rs/tower/examples"]},
         "Repeats the same search; only request_id differs (a fresh UUID each call), the hits are the same."),
        ("api::get_user", lambda t: {"id": 4411, "requestId": "req_" + t.hexid(10)}, {"id": 4411, "name": "Ana Diaz", "plan": "pro"},
         "Fetches the same user again and again with a new requestId each time; same answer."),
        ("kv::get", lambda t: {"key": "feature/new-checkout", "nonce": t.rng.randint(10 ** 9, 10 ** 10)}, {"value": "off"},
         "Reads the same flag with a random nonce each time; the flag stays off."),
        ("weather::current", lambda t: {"city": "Paris", "units": "metric", "timestamp": f"2024-06-12T10:{t.t // 60000:02d}:{(t.t // 1000) % 60:02d}Z"}, {"tempC": 21, "sky": "clear"},
         "Asks for the same city's weather, the client timestamp changing each call; same answer."),
        ("metrics::query", lambda t: {"expr": "sum(rate(http_requests_total{code=~\"5..\"}[5m]))", "ts": 1718186400 + t.t // 1000}, {"value": 0.0},
         "Evaluates the same instant query with ts set to the client's clock each time; the value stays 0."),
        ("db::query", lambda t: {"sql": "SELECT status FROM jobs WHERE id=91", "request_id": t.hexid(12), "sentAt": f"2024-06-12T11:00:{(t.t // 1000) % 60:02d}Z"}, {"rows": [["stalled"]]},
         "Runs the same query with a new request_id and sentAt every time; the row is the same."),
    ]
    for k, (tool, mk, res, why) in enumerate(reads):
        t = Trace("noise", "loop", why, 700 + k)
        t.add("notes::read", READ, {"file": "task.md"}, {"content": "check the thing"})
        first = None
        for i in range(8):
            idx = t.add(tool, READ, mk(t), res, gap=(1500, 5000))
            first = idx if first is None else first
        t.stop(first + 2, first + 4)
        out.append(t)
    writes = [
        ("mail::send", lambda t: {"to": "cfo@acme.io", "subject": "Q2 budget", "body": "Draft attached.", "idempotencyKey": "ik_" + t.hexid(16)}, lambda t: {"messageId": f"<{t.hexid(12)}@mail.acme.io>"},
         "Sends the same mail repeatedly, each with a new idempotencyKey (so no store deduplicates it); each answer a new message id."),
        ("chat::post", lambda t: {"channel": "#incidents", "text": "INC-311 resolved", "sentAt": f"2024-06-12T12:{(t.t // 60000) % 60:02d}:{(t.t // 1000) % 60:02d}Z"}, lambda t: {"id": t.hexid(10)},
         "Posts the same resolution message with a new sentAt each time; each post appears again in the channel."),
        ("github::create_issue", lambda t: {"repo": "acme/web", "title": "Checkout 500 on empty cart", "body": "Steps: ...", "request_id": t.hexid(8)}, lambda t: {"number": t.rng.randint(900, 999)},
         "Files the same issue again with a new request_id each time; each answer a new issue number."),
    ]
    for k, (tool, mk, mkres, why) in enumerate(writes):
        t = Trace("noise", "loop", why, 710 + k)
        t.add("docs::read", READ, {"path": "templates/notice.md"}, {"content": "template"})
        sends = [t.add(tool, WRITE, mk(t), mkres(t), gap=(4000, 15000)) for _ in range(5)]
        t.stop(sends[1], sends[2])
        out.append(t)
    # productive look-alikes: a real member changes
    t = Trace("noise", "productive", "", 720)
    since = 1718186400
    for i in range(8):
        t.add("logs::query", READ, {"service": "api", "level": "error", "since": since + 30 * i, "request_id": t.hexid(8)}, {"lines": [f"err {i}-{j}" for j in range(2)]}, gap=(25000, 35000))
    t.reason = "Tails error logs with an advancing `since` (a real member, not client noise) and new lines each time; request_id also changes but is not what moves."
    out.append(t)
    t = Trace("noise", "productive", "", 721)
    for i in range(7):
        t.add("api::list_events", READ, {"after": f"evt_{1000 + 25 * i}", "limit": 25, "requestId": "req_" + t.hexid(6)}, {"events": 25 if i < 6 else 9})
    t.reason = "Pages through events with an `after` cursor that advances; each page differs."
    out.append(t)
    t = Trace("noise", "productive", "", 722)
    for i in range(7):
        t.add("metrics::query_range", READ, {"expr": "sum(rate(http_requests_total[1m]))", "start": 1718180000 + 3600 * i, "end": 1718183600 + 3600 * i, "ts": 1718190000 + i * 5},
              {"points": 60, "max": 120 + 17 * i})
    t.reason = "Queries successive hours (start/end move); the client ts changes too, but the windows and answers differ."
    out.append(t)
    t = Trace("noise", "productive", "", 723)
    for key in ["feature/new-checkout", "feature/dark-mode", "feature/ai-summary", "feature/beta-api", "limits/max-upload", "limits/rate"]:
        t.add("kv::get", READ, {"key": key, "nonce": t.rng.randint(10 ** 9, 10 ** 10)}, {"value": t.rng.choice(["on", "off", "10MB", "100/s"])})
    t.reason = "Reads six different keys, each with a nonce; the key differs every call."
    out.append(t)
    t = Trace("noise", "productive", "", 724)
    for i, to in enumerate(["a@x.io", "b@x.io", "c@x.io", "d@x.io", "e@x.io", "f@x.io"]):
        t.add("mail::send", WRITE, {"to": to, "subject": "Your export is ready", "body": f"Download: https://x.io/e/{100 + i}", "idempotencyKey": f"export-{100 + i}"}, {"messageId": f"<{t.hexid(10)}@x.io>"})
    t.reason = "Notifies six different users; recipient and link differ on each send (each with its own idempotency key)."
    out.append(t)
    return out


# ---------------------------------------------------------------- batch work
@family("batch")
def batch():
    out = []
    files = ["src/lib.rs", "src/error.rs", "src/retry/mod.rs", "src/retry/policy.rs", "src/breaker/mod.rs", "src/breaker/state.rs",
             "src/timeout.rs", "src/trace/mod.rs", "src/trace/span.rs", "src/registry.rs", "src/canonical.rs", "src/envelope.rs",
             "src/rate_limit/mod.rs", "src/rate_limit/gcra.rs", "src/idempotency/mod.rs", "src/idempotency/memory.rs"]
    jobs = [
        ("fs::read_file", READ, lambda f: {"path": f}, lambda f: {"content": f"// {f}\n...", "lines": 100 + len(f) * 3}, 16, "Reads every source file of a crate once, one path per call."),
        ("lint::check", READ, lambda f: {"path": f, "rules": "all"}, lambda f: {"warnings": len(f) % 3}, 14, "Lints fourteen files, each once."),
        ("fs::write_file", WRITE, lambda f: {"path": f.replace("src/", "docs/api/").replace(".rs", ".md"), "content": f"# {f}"}, lambda f: {"bytes": 40 + len(f)}, 12, "Writes one doc page per module; every path differs."),
        ("shell::bash", CMD, lambda f: {"command": f"wc -l {f}"}, lambda f: {"exitCode": 0, "stdout": f"{80 + len(f) * 7} {f}"}, 12, "Counts lines of twelve files through bash, one file per command."),
    ]
    for k, (tool, risk, mka, mkr, n, why) in enumerate(jobs):
        t = Trace("batch", "productive", why, 800 + k)
        t.add("fs::list_dir", READ, {"path": "src", "recursive": True}, {"entries": files})
        for f in files[:n]:
            t.add(tool, risk, mka(f), mkr(f), gap=(600, 2500))
        out.append(t)
    t = Trace("batch", "productive", "Resizes twenty product images, one key per call; every call has a different source and target.", 804)
    for i in range(20):
        t.add("image::resize", WRITE, {"src": f"s3://catalog/raw/sku-{3100 + i}.jpg", "dst": f"s3://catalog/thumb/sku-{3100 + i}.jpg", "width": 320}, {"bytes": 18000 + 37 * i}, gap=(400, 1500))
    out.append(t)
    t = Trace("batch", "productive", "Translates the UI strings of one screen, one string per call, all different.", 805)
    for s in ["Sign in", "Email", "Password", "Forgot password?", "Create account", "Remember me", "Sign in with Google", "Terms", "Privacy"]:
        t.add("translate::text", READ, {"text": s, "to": "de"}, {"text": f"[de] {s}"})
    out.append(t)
    t = Trace("batch", "productive", "Downloads ten log archives, each a different key; one key fails once and is fetched once more, successfully.", 806)
    for i in range(10):
        key = f"logs/2024-06-{i + 1:02d}.gz"
        if i == 4:
            t.add("s3::get_object", READ, {"bucket": "acme-logs", "key": key}, error=("TIMEOUT", "read timed out"))
        t.add("s3::get_object", READ, {"bucket": "acme-logs", "key": key}, {"bytes": 100000 + i * 731})
    out.append(t)
    # loops inside batch work
    t = Trace("batch", "loop", "", 810)
    for f in files[:5]:
        t.add("fs::read_file", READ, {"path": f}, {"content": f"// {f}"})
    s = t.add("fs::read_file", READ, {"path": "src/breaker/state.rs"}, {"content": "// src/breaker/state.rs"})
    for _ in range(6):
        t.add("fs::read_file", READ, {"path": "src/breaker/state.rs"}, {"content": "// src/breaker/state.rs"}, gap=(1000, 3000))
    t.stop(s + 2, s + 4)
    t.reason = "Starts a batch of reads normally, then stalls on one file and reads it again and again; same content each time."
    out.append(t)
    t = Trace("batch", "loop", "", 811)
    for f in files[:3]:
        t.add("lint::check", READ, {"path": f, "rules": "all"}, {"warnings": 0})
    s = t.add("lint::check", READ, {"path": "src/retry/policy.rs", "rules": "all"}, {"warnings": 3, "first": "unused variable `jitter`"})
    for _ in range(6):
        t.add("lint::check", READ, {"path": "src/retry/policy.rs", "rules": "all"}, {"warnings": 3, "first": "unused variable `jitter`"}, gap=(1500, 4000))
    t.stop(s + 2, s + 4)
    t.reason = "Lints a file with warnings and re-lints it repeatedly without editing it; the same three warnings come back."
    out.append(t)
    t = Trace("batch", "loop", "", 812)
    for i in range(3):
        t.add("s3::get_object", READ, {"bucket": "acme-logs", "key": f"logs/2024-05-{28 + i:02d}.gz"}, {"bytes": 90000 + i})
    s = t.add("s3::get_object", READ, {"bucket": "acme-logs", "key": "logs/2024-05-31.gz"}, error=("NOT_FOUND", "NoSuchKey: logs/2024-05-31.gz"))
    for _ in range(6):
        t.add("s3::get_object", READ, {"bucket": "acme-logs", "key": "logs/2024-05-31.gz"}, error=("NOT_FOUND", "NoSuchKey: logs/2024-05-31.gz"), gap=(1000, 3000))
    t.stop(s + 3, s + 5)
    t.reason = "Batch download hits a missing key and requests it again and again; the same NOT_FOUND each time (after 3 identical failures, stop)."
    out.append(t)
    return out


# ---------------------------------------------------------------- refined searches
@family("refined_search")
def refined_search():
    out = []
    chains = [
        ["tower retry", "tower retry policy", "tower retry policy clone request", "tower::retry::Policy clone_request body", "tower retry policy clone_request http body buffered"],
        ["postgres slow query", "postgres slow query orders table", "postgres explain analyze seq scan orders", "postgres index on orders(status, updated_at)", "postgres partial index status stuck"],
        ["k8s CrashLoopBackOff", "CrashLoopBackOff missing env", "kubernetes secret env DATABASE_URL", "kubectl create secret generic from env file", "kubernetes envFrom secretRef"],
        ["invoice not paid", "invoice INV-2291", "INV-2291 payment", "INV-2291 payment failed card", "ACME-44 card expired"],
        ["react useEffect runs twice", "useEffect twice strict mode", "react 18 strict mode double invoke effects", "disable strict mode double render dev"],
        ["flight BER LIS june 20", "flight BER LIS june 20 morning", "flight BER LIS june 20 morning direct", "TAP TP539 june 20 price", "TAP TP539 seat availability"],
    ]
    for k, chain in enumerate(chains):
        t = Trace("refined_search", "productive", "", 900 + k)
        tool = "web::search" if k % 3 else "docs::search"
        for q in chain:
            t.add(tool, READ, {"q": q}, {"hits": [f"{q.split()[-1]}-{i}" for i in range(3)]})
            if chain.index(q) % 2 == 1:
                t.add("web::fetch", READ, {"url": f"https://example.org/{q.split()[-1]}"}, {"status": 200})
        t.reason = f"Refines a {tool} query step by step ({len(chain)} different queries), reading a result now and then."
        out.append(t)
    t = Trace("refined_search", "productive", "", 906)
    for q in ["grpc deadline exceeded", "grpc deadline exceeded", "grpc deadline exceeded tonic", "tonic timeout interceptor", "tonic Request set_timeout"]:
        t.add("code::search", READ, {"q": q, "repo": "acme/api"}, {"hits": [f"{q[-6:]}:{i}" for i in range(2)]})
    t.calls[1]["result"] = {"hits": ["new:3", "new:4"]}
    t.add("web::fetch", READ, {"url": "https://docs.rs/tonic/latest/tonic/struct.Request.html#method.set_timeout"}, {"status": 200})
    t.reason = "Refines a code search; one query is repeated once, and its answer differs (new commits indexed), then the query changes again."
    out.append(t)
    loops = [
        ("web::search", {"q": "tower-toolcall LOOP_DETECTED how to fix"}, {"hits": ["github.com/acme/tower-toolcall/README"]},
         "Searches the exact same query again and again and gets the same single hit."),
        ("docs::search", {"q": "rate limit per tool"}, {"hits": ["RateLimitLayer", "registry policy"]},
         "Repeats the same docs search without changing a word; same hits every time."),
        ("code::search", {"q": "fn canonical_params", "repo": "acme/api"}, {"hits": []},
         "Searches code for a function that does not exist, with the same query each time; always no hits."),
    ]
    for k, (tool, args, res, why) in enumerate(loops):
        t = Trace("refined_search", "loop", why, 910 + k)
        t.add(tool, READ, {"q": args["q"].split()[0], **{x: y for x, y in args.items() if x != "q"}}, {"hits": ["a", "b", "c"]})
        s = t.add(tool, READ, args, res)
        for _ in range(6):
            t.add(tool, READ, args, res, gap=(2000, 6000))
        t.stop(s + 2, s + 4)
        out.append(t)
    t = Trace("refined_search", "loop", "", 913)
    t.add("web::search", READ, {"q": "openhands stuck detector"}, {"hits": ["docs.all-hands.dev"]})
    qa = ("web::search", READ, {"q": "openhands stuck detector threshold"}, {"hits": ["github.com/All-Hands-AI/OpenHands/issues/1"]})
    qb = ("web::search", READ, {"q": "openhands stuck detector default threshold"}, {"hits": ["github.com/All-Hands-AI/OpenHands/issues/1"]})
    start = len(t.calls)
    for _ in range(5):
        for tool, risk, a, r in (qa, qb):
            t.add(tool, risk, a, r, gap=(2000, 5000))
    t.stop(start + 4, start + 5)
    t.reason = "Alternates between two wordings of the same search, both giving the same hit; a cycle of 2 with unchanged answers."
    out.append(t)
    return out


# ---------------------------------------------------------------- read after write
@family("read_after_write")
def read_after_write():
    out = []
    specs = [
        ("fs::read_file", "fs::write_file", "config/app.yaml", "path", lambda v: {"content": f"port: {v}"}, lambda v: {"content": f"port: {v}"}, [8080, 9090, 9091]),
        ("kv::get", "kv::put", "limits/max-upload", "key", lambda v: {"value": v}, lambda v: {"value": v}, ["10MB", "25MB", "50MB"]),
        ("db::get_row", "db::update_row", "users/4411", "id", lambda v: {"row": {"plan": v}}, lambda v: {"set": {"plan": v}}, ["pro", "team", "enterprise"]),
        ("config::get", "config::set", "feature.checkout_v2", "name", lambda v: {"value": v}, lambda v: {"value": v}, ["off", "canary", "on"]),
        ("crm::get_contact", "crm::update_contact", "c-881", "id", lambda v: {"email": v}, lambda v: {"email": v}, ["old@x.io", "new@x.io", "new2@x.io"]),
    ]
    for k, (rt, wt, key, kname, mkr, mkw, vals) in enumerate(specs):
        t = Trace("read_after_write", "productive", "", 1000 + k)
        t.add(rt, READ, {kname: key}, mkr(vals[0]))
        for v in vals[1:]:
            t.add(wt, WRITE, {kname: key, **mkw(v)}, {"ok": True})
            t.add(rt, READ, {kname: key}, mkr(v))
        t.add(rt, READ, {kname: key}, mkr(vals[-1]))
        t.add("chat::reply", WRITE, {"text": f"{key} updated"}, {"ok": True})
        t.reason = f"Reads {key}, writes a new value, reads it back to verify; every read after a write shows the new value, and a last check reads it once more."
        out.append(t)
    t = Trace("read_after_write", "productive", "", 1005)
    content = "fn main() {}"
    t.add("fs::read_file", READ, {"path": "src/main.rs"}, {"content": content})
    for i, add in enumerate(["use std::env;", "let port = env::var(\"PORT\");", "println!(\"{port:?}\");"]):
        t.add("fs::edit_file", WRITE, {"path": "src/main.rs", "insert": add, "line": 1 + i}, {"ok": True})
        content += "\n" + add
        t.add("fs::read_file", READ, {"path": "src/main.rs"}, {"content": content})
        t.add("shell::bash", CMD, {"command": "cargo check"}, {"exitCode": 0 if i == 2 else 101})
    t.reason = "Edits a file in three steps, reading it back and checking after each edit; the content grows every time."
    out.append(t)
    # loops: the write does not take effect, same write and same read again and again
    t = Trace("read_after_write", "loop", "", 1010)
    t.add("kv::get", READ, {"key": "limits/rate"}, {"value": "100/s"})
    start = len(t.calls)
    for _ in range(5):
        t.add("kv::put", WRITE, {"key": "limits/rate", "value": "200/s"}, {"ok": True, "note": "ignored: key is managed by policy"})
        t.add("kv::get", READ, {"key": "limits/rate"}, {"value": "100/s"})
    t.stop(start + 4, start + 5)
    t.reason = "Writes the same value, reads back the old one, and writes the same value again; put/get repeat unchanged as a cycle of 2."
    out.append(t)
    t = Trace("read_after_write", "loop", "", 1011)
    t.add("fs::read_file", READ, {"path": "/etc/app/limits.conf"}, {"content": "max=10"})
    s = t.add("fs::write_file", WRITE, {"path": "/etc/app/limits.conf", "content": "max=20"}, error=("POLICY_DENIED", "read-only file system"))
    for _ in range(6):
        t.add("fs::write_file", WRITE, {"path": "/etc/app/limits.conf", "content": "max=20"}, error=("POLICY_DENIED", "read-only file system"), gap=(1500, 4000))
    t.stop(s + 3, s + 5)
    t.reason = "Tries the same write to a read-only file again and again; the same POLICY_DENIED each time (after 3 identical failures, stop)."
    out.append(t)
    t = Trace("read_after_write", "loop", "", 1012)
    t.add("db::get_row", READ, {"id": "orders/991"}, {"row": {"status": "stuck"}})
    start = len(t.calls)
    for _ in range(4):
        t.add("db::update_row", WRITE, {"id": "orders/991", "set": {"status": "shipped"}}, {"ok": True, "affected": 0})
        t.add("db::get_row", READ, {"id": "orders/991"}, {"row": {"status": "stuck"}})
        t.add("logs::search", READ, {"q": "orders/991 trigger"}, {"count": 0})
    t.stop(start + 6, start + 8)
    t.reason = "Update (affects 0 rows), read back the unchanged row, search logs; the same 3 calls and answers repeat (cycle of 3)."
    out.append(t)
    return out


# ---------------------------------------------------------------- repeated reads separated by writes
@family("reads_between_writes")
def reads_between_writes():
    out = []
    t = Trace("reads_between_writes", "productive", "", 1100)
    plan = {"content": "1. error.rs 2. retry.rs 3. breaker.rs 4. timeout.rs 5. lib.rs"}
    for f in ["src/error.rs", "src/retry.rs", "src/breaker.rs", "src/timeout.rs", "src/lib.rs"]:
        t.add("fs::read_file", READ, {"path": "PLAN.md"}, plan)
        t.add("fs::edit_file", WRITE, {"path": f, "old": "Box<dyn Error>", "new": "ToolError"}, {"ok": True})
    t.add("tests::run", CMD, {}, {"failed": 0})
    t.reason = "Re-reads the same unchanged plan before each step, but each step edits a different file: the work moves on."
    out.append(t)
    t = Trace("reads_between_writes", "productive", "", 1101)
    for i in range(5):
        t.add("fs::read_file", READ, {"path": "CHANGELOG.md"}, {"content": f"## Unreleased\n{i} entries"})
        t.add("fs::edit_file", WRITE, {"path": "CHANGELOG.md", "append": f"- change {i + 1}"}, {"ok": True})
    t.add("fs::read_file", READ, {"path": "CHANGELOG.md"}, {"content": "## Unreleased\n5 entries"})
    t.reason = "Reads the changelog, appends an entry, reads it again: the same read shows one more entry each time."
    out.append(t)
    t = Trace("reads_between_writes", "productive", "", 1102)
    style = {"content": "STYLE: no unwrap, document pub items"}
    for i, f in enumerate(["src/a.rs", "src/b.rs", "src/c.rs", "src/d.rs"]):
        t.add("fs::read_file", READ, {"path": "STYLE.md"}, style)
        t.add("fs::read_file", READ, {"path": f}, {"content": f"// {f}"})
        t.add("fs::write_file", WRITE, {"path": f, "content": f"//! docs\n// {f}"}, {"ok": True})
    t.reason = "Consults the same style guide before rewriting each of four files; the style guide's answer is the same but every write is to a new file."
    out.append(t)
    t = Trace("reads_between_writes", "productive", "", 1103)
    for i in range(6):
        t.add("sheet::read_range", READ, {"sheet": "Budget", "range": "A1:D20"}, {"total": 1000 + 150 * i})
        t.add("sheet::write_cell", WRITE, {"sheet": "Budget", "cell": f"C{3 + i}", "value": 150}, {"ok": True})
    t.reason = "Fills budget cells one by one, reading the same range between writes; the total grows with each write."
    out.append(t)
    t = Trace("reads_between_writes", "productive", "", 1104)
    ticket = {"status": "In progress", "checklist": "0/5"}
    for i in range(5):
        t.add("jira::get_issue", READ, {"key": "OPS-812"}, {"status": "In progress", "checklist": f"{i}/5"})
        t.add("shell::bash", CMD, {"command": f"./rotate-cert.sh --step {i + 1}"}, {"exitCode": 0})
        t.add("jira::update_checklist", WRITE, {"key": "OPS-812", "item": i + 1, "done": True}, {"ok": True})
    _ = ticket
    t.reason = "Works through a ticket's checklist: reads the ticket (progress moves), runs the next step, ticks it."
    out.append(t)
    t = Trace("reads_between_writes", "productive", "", 1105)
    spec = {"content": "API: GET /users, POST /users, DELETE /users/:id"}
    for ep in ["get_users", "post_users", "delete_user"]:
        t.add("fs::read_file", READ, {"path": "docs/api.md"}, spec)
        t.add("fs::write_file", WRITE, {"path": f"src/handlers/{ep}.rs", "content": f"pub async fn {ep}() {{}}"}, {"ok": True})
        t.add("shell::bash", CMD, {"command": "cargo check"}, {"exitCode": 0})
    t.reason = "Re-reads the same API spec before writing each handler; each handler file differs; the check passes each time (after different writes)."
    out.append(t)
    # loops: the writes between the reads are the same too
    t = Trace("reads_between_writes", "loop", "", 1110)
    t.add("fs::read_file", READ, {"path": "README.md"}, {"content": "# app"})
    start = len(t.calls)
    for _ in range(5):
        t.add("fs::read_file", READ, {"path": "src/config.rs"}, {"content": "pub const PORT: u16 = 8080;"})
        t.add("fs::write_file", WRITE, {"path": "src/config.rs", "content": "pub const PORT: u16 = 8080;"}, {"ok": True})
    t.stop(start + 4, start + 5)
    t.reason = "Reads a file and writes back exactly what it read, round after round: a cycle of 2 where nothing changes."
    out.append(t)
    t = Trace("reads_between_writes", "loop", "", 1111)
    start = 0
    for _ in range(4):
        t.add("sheet::read_range", READ, {"sheet": "Q2", "range": "A1:B10"}, {"total": 4200})
        t.add("sheet::write_cell", WRITE, {"sheet": "Q2", "cell": "B4", "value": "=SUM(B1:B3)"}, {"ok": True})
        t.add("sheet::read_cell", READ, {"sheet": "Q2", "cell": "B4"}, {"value": "#REF!"})
    t.stop(start + 6, start + 8)
    t.reason = "Writes the same formula, reads the same #REF! error back and the same range, round after round (cycle of 3)."
    out.append(t)
    t = Trace("reads_between_writes", "loop", "", 1112)
    t.add("jira::get_issue", READ, {"key": "OPS-900"}, {"status": "Blocked"})
    start = len(t.calls)
    for _ in range(5):
        t.add("jira::get_issue", READ, {"key": "OPS-900"}, {"status": "Blocked", "comments": 3})
        t.add("jira::transition", WRITE, {"key": "OPS-900", "to": "Done"}, error=("PRECONDITION_FAILED", "transition not allowed from Blocked"))
    t.stop(start + 4, start + 5)
    t.reason = "Reads the blocked ticket and tries the same forbidden transition, over and over; same answer and same error each round."
    out.append(t)
    return out


# ---------------------------------------------------------------- slow models
@family("slow_model")
def slow_model():
    out = []
    loops = [
        ("fs::read_file", {"path": "src/detector.rs"}, {"content": "pub struct Detector { .. }"}, (22000, 30000)),
        ("web::search", {"q": "why does my tower service never become ready"}, {"hits": ["github.com/tower-rs/tower/issues/412"]}, (20000, 28000)),
        ("db::query", {"sql": "SELECT count(*) FROM sessions WHERE expired"}, {"rows": [[0]]}, (25000, 29000)),
        ("shell::bash", {"command": "git status --short"}, {"exitCode": 0, "stdout": " M src/lib.rs"}, (18000, 26000)),
        ("api::get_order", {"id": "ord_9912"}, {"status": "cancelled"}, (24000, 29000)),
        ("docs::read", {"path": "guides/quickstart.md"}, {"content": "Install, configure, run."}, (15000, 25000)),
    ]
    for k, (tool, args, res, gap) in enumerate(loops):
        risk = CMD if tool == "shell::bash" else READ
        t = Trace("slow_model", "loop", "", 1200 + k)
        t.add("notes::read", READ, {"file": "task.md"}, {"content": "task"}, gap=gap)
        s = t.add(tool, risk, args, res, gap=gap)
        for _ in range(5):
            t.add(tool, risk, args, res, gap=gap)
        t.stop(s + 2, s + 4)
        t.reason = (f"A slow model ({gap[0] // 1000}-{gap[1] // 1000} s between calls) repeats the same {tool} call with the same answer; "
                    "the repeats still fall well inside two minutes.")
        out.append(t)
    t = Trace("slow_model", "productive", "", 1210)
    for i, sec in enumerate(["Overview", "Install", "Configure", "Layers", "Retry", "Breaker", "Timeouts"]):
        t.add("docs::read_section", READ, {"path": "guide.md", "section": sec}, {"text": f"{sec}..."}, gap=(30000, 60000))
    t.reason = "A slow model reads a guide section by section, 30-60 s between calls; the section differs every call."
    out.append(t)
    t = Trace("slow_model", "productive", "", 1211)
    for i in range(7):
        t.add("process::read_output", READ, {"pid": 3321}, {"stdout": f"epoch {i + 1}/7 loss {2.1 - 0.25 * i:.2f}"}, gap=(40000, 70000))
    t.reason = "Reads a training run's output about once a minute with the same call; each answer shows a new epoch."
    out.append(t)
    t = Trace("slow_model", "productive", "", 1212)
    for i, f in enumerate(["a.py", "b.py", "c.py", "d.py", "e.py", "f.py"]):
        t.add("fs::read_file", READ, {"path": f"app/{f}"}, {"content": f"# {f}"}, gap=(20000, 45000))
        if i % 2:
            t.add("fs::edit_file", WRITE, {"path": f"app/{f}", "old": "print", "new": "log.info"}, {"ok": True}, gap=(20000, 45000))
    t.reason = "A slow model reviews and edits files with long pauses; every call is about a different file."
    out.append(t)
    t = Trace("slow_model", "productive", "", 1213)
    t.add("shell::bash", CMD, {"command": "git status --short"}, {"exitCode": 0, "stdout": " M src/lib.rs"}, gap=(20000, 40000))
    t.add("fs::edit_file", WRITE, {"path": "src/main.rs", "old": "a", "new": "b"}, {"ok": True}, gap=(20000, 40000))
    t.add("shell::bash", CMD, {"command": "git status --short"}, {"exitCode": 0, "stdout": " M src/lib.rs\n M src/main.rs"}, gap=(20000, 40000))
    t.add("fs::edit_file", WRITE, {"path": "src/util.rs", "old": "a", "new": "b"}, {"ok": True}, gap=(20000, 40000))
    t.add("shell::bash", CMD, {"command": "git status --short"}, {"exitCode": 0, "stdout": " M src/lib.rs\n M src/main.rs\n M src/util.rs"}, gap=(20000, 40000))
    t.add("shell::bash", CMD, {"command": "git commit -am 'Use b'"}, {"exitCode": 0}, gap=(20000, 40000))
    t.reason = "A slow model checks git status between edits; the same command, a longer answer each time."
    out.append(t)
    t = Trace("slow_model", "productive", "", 1214)
    for i in range(6):
        t.add("web::search", READ, {"q": ["bge embeddings", "bge-small onnx", "bge-small onnx rust", "ort crate bge-small", "ort session run tokenizer", "tokenizers crate wordpiece"][i]}, {"hits": [f"h{i}"]}, gap=(35000, 80000))
    t.reason = "A slow model refines its search about once a minute; every query differs."
    out.append(t)
    return out


# ---------------------------------------------------------------- back-off retries
@family("backoff")
def backoff():
    out = []
    specs = [
        ("http::get", {"url": "https://api.partner.example/v1/rates"}, ("UPSTREAM_UNAVAILABLE", "503 Service Unavailable"), [1000, 2000, 4000], {"status": 200, "rates": {"EUR": 1.08}}),
        ("payments::get_balance", {"account": "acct_1Nf"}, ("RATE_LIMITED", "429 Too Many Requests, retry after 2s"), [2000, 4000, 8000, 16000], {"available": 120450}),
        ("llm::embed", {"model": "text-embedding-3-small", "input": "retry budget"}, ("TIMEOUT", "request timed out after 10s"), [1500, 3000, 6000], {"dims": 1536}),
        ("db::query", {"sql": "SELECT * FROM plans"}, ("UPSTREAM_UNAVAILABLE", "connection refused (failover in progress)"), [1000, 2000, 4000, 8000], {"rows": 4}),
        ("storage::put_object", {"bucket": "reports", "key": "2024-06.pdf", "bytes": 81233}, ("UPSTREAM_ERROR", "500 InternalError, please retry"), [2000, 5000, 10000], {"etag": "\"9b2cf535f27731c974343645a3985328\""}),
    ]
    for k, (tool, args, err, gaps, ok) in enumerate(specs):
        risk = WRITE if tool == "storage::put_object" else READ
        t = Trace("backoff", "productive", "", 1300 + k)
        t.add("notes::read", READ, {"file": "task.md"}, {"content": "fetch"})
        t.add(tool, risk, args, error=err)
        for g in gaps:
            t.add(tool, risk, args, error=err, gap=g + t.rng.randint(0, 400)) if g != gaps[-1] else None
        t.add(tool, risk, args, ok, gap=gaps[-1] + t.rng.randint(0, 400))
        t.add("chat::reply", WRITE, {"text": "done"}, {"ok": True})
        t.reason = (f"Retries a transiently failing call ({err[0]}) with a growing back-off ({', '.join(str(g // 1000 if g >= 1000 else g) for g in gaps)} s), "
                    f"{len(gaps) + 1} attempts in all; it succeeds on the last one.")
        out.append(t)
    t = Trace("backoff", "productive", "", 1305)
    args = {"url": "https://status.partner.example/api/v2/summary.json"}
    t.add("http::get", READ, args, error=("UPSTREAM_UNAVAILABLE", "502 Bad Gateway"))
    for g in [2000, 4000, 8000, 16000]:
        t.add("http::get", READ, args, error=("UPSTREAM_UNAVAILABLE", "502 Bad Gateway"), gap=g)
    t.add("chat::reply", WRITE, {"text": "The partner API is down (502 for 30 s); I'll use cached rates."}, {"ok": True})
    t.add("cache::get", READ, {"key": "rates"}, {"value": {"EUR": 1.07}})
    t.add("report::write", WRITE, {"path": "rates.md", "source": "cache"}, {"ok": True})
    t.reason = "Five attempts with back-off (2, 4, 8, 16 s), all failing; then the agent gives up and uses the cache. A reasonable retry budget."
    out.append(t)
    loops = [
        ("http::get", {"url": "https://api.partner.example/v1/rates"}, ("UPSTREAM_UNAVAILABLE", "503 Service Unavailable"), (200, 600)),
        ("payments::get_balance", {"account": "acct_1Nf"}, ("RATE_LIMITED", "429 Too Many Requests"), (100, 400)),
        ("db::query", {"sql": "SELECT * FROM plans"}, ("UPSTREAM_UNAVAILABLE", "connection refused"), (300, 900)),
        ("llm::complete", {"model": "gpt-4o-mini", "prompt": "Summarise the incident"}, ("TIMEOUT", "request timed out after 30s"), (150, 500)),
        ("shell::bash", {"command": "curl -fsS https://registry.example.com/v2/"}, ("UPSTREAM_ERROR", "curl: (22) The requested URL returned error: 502"), (300, 800)),
    ]
    for k, (tool, args, err, gap) in enumerate(loops):
        risk = CMD if tool == "shell::bash" else READ
        t = Trace("backoff", "loop", "", 1310 + k)
        t.add("notes::read", READ, {"file": "task.md"}, {"content": "fetch"})
        s = t.add(tool, risk, args, error=err)
        for _ in range(8):
            t.add(tool, risk, args, error=err, gap=gap)
        t.stop(s + 3, s + 5)
        t.reason = f"Retries a failing call immediately ({gap[0]}-{gap[1]} ms apart, no back-off), the same {err[0]} every time; after 3 identical failures further tries are pointless."
        out.append(t)
    return out


# ---------------------------------------------------------------- repeated identical failures
@family("failures")
def failures():
    out = []
    loops = [
        ("fs::read_file", READ, {"path": "src/retry/budget.rs"}, ("NOT_FOUND", "no such file: src/retry/budget.rs")),
        ("github::merge_pr", WRITE, {"repo": "acme/web", "number": 427, "method": "squash"}, ("PRECONDITION_FAILED", "required status check 'ci' is failing")),
        ("db::query", READ, {"sql": "SELECT * FROM order WHERE id=1"}, ("VALIDATION_ERROR", "syntax error at or near \"order\"")),
        ("mail::send", WRITE, {"to": "ceo@acme", "subject": "Report", "body": "..."}, ("VALIDATION_ERROR", "invalid recipient address 'ceo@acme'")),
        ("shell::bash", CMD, {"command": "npm run buidl"}, ("UPSTREAM_ERROR", "npm ERR! Missing script: \"buidl\"")),
        ("cloud::create_bucket", WRITE, {"name": "acme-logs", "region": "eu-west-1"}, ("CONFLICT", "bucket name already taken")),
    ]
    for k, (tool, risk, args, err) in enumerate(loops):
        t = Trace("failures", "loop", "", 1400 + k)
        t.add("notes::read", READ, {"file": "task.md"}, {"content": "do it"})
        if k % 2:
            t.add("fs::list_dir", READ, {"path": "."}, {"entries": ["src", "docs"]})
        s = t.add(tool, risk, args, error=err)
        for _ in range(7):
            t.add(tool, risk, args, error=err, gap=(2000, 6000))
        t.stop(s + 3, s + 5)
        t.reason = f"Repeats the same call that fails with the same permanent error ({err[0]}: {err[1]}) at a normal pace, changing nothing."
        out.append(t)
    t = Trace("failures", "productive", "", 1410)
    for sql, e in [("SELECT * FROM order WHERE id=1", "syntax error at or near \"order\""), ("SELECT * FROM \"order\" WHERE id=1", "relation \"order\" does not exist"), ("SELECT * FROM orders WHERE id=1", None)]:
        if e:
            t.add("db::query", READ, {"sql": sql}, error=("VALIDATION_ERROR", e))
        else:
            t.add("db::query", READ, {"sql": sql}, {"rows": [[1, "shipped"]]})
    t.add("db::query", READ, {"sql": "SELECT * FROM orders WHERE status='stuck'"}, {"rows": []})
    t.add("db::describe_table", READ, {"table": "orders"}, {"columns": ["id", "status"]})
    t.add("chat::reply", WRITE, {"text": "order 1 is shipped"}, {"ok": True})
    t.reason = "Each failing query is fixed before the next try; different SQL every time until it works."
    out.append(t)
    t = Trace("failures", "productive", "", 1411)
    t.add("shell::bash", CMD, {"command": "cargo test"}, error=("UPSTREAM_ERROR", "error: linker `cc` not found"))
    t.add("shell::bash", CMD, {"command": "apt-get install -y build-essential"}, {"exitCode": 0})
    t.add("shell::bash", CMD, {"command": "cargo test"}, error=("UPSTREAM_ERROR", "error: failed to run custom build command for `openssl-sys`"))
    t.add("shell::bash", CMD, {"command": "apt-get install -y libssl-dev pkg-config"}, {"exitCode": 0})
    t.add("shell::bash", CMD, {"command": "cargo test"}, {"exitCode": 0, "stdout": "test result: ok. 212 passed"})
    t.add("chat::reply", WRITE, {"text": "tests pass"}, {"ok": True})
    t.reason = "The same command fails twice with different errors, each followed by a fix; the third run passes."
    out.append(t)
    t = Trace("failures", "productive", "", 1412)
    for path, ok in [("src/retry/budget.rs", False), ("src/retry/mod.rs", True), ("src/retry/policy.rs", True), ("src/budget.rs", False), ("src/retry/backoff.rs", True), ("src/retry/jitter.rs", True)]:
        if ok:
            t.add("fs::read_file", READ, {"path": path}, {"content": f"// {path}"})
        else:
            t.add("fs::read_file", READ, {"path": path}, error=("NOT_FOUND", f"no such file: {path}"))
    t.reason = "Explores a module; two guessed paths do not exist, every path is different."
    out.append(t)
    t = Trace("failures", "productive", "", 1413)
    addrs = ["ceo@acme", "ceo@acme.io"]
    t.add("mail::send", WRITE, {"to": addrs[0], "subject": "Report", "body": "..."}, error=("VALIDATION_ERROR", "invalid recipient address 'ceo@acme'"))
    t.add("crm::search", READ, {"q": "ceo"}, {"contacts": [{"email": "ceo@acme.io"}]})
    t.add("mail::send", WRITE, {"to": addrs[1], "subject": "Report", "body": "..."}, {"messageId": "<77a1@mail.acme.io>"})
    t.add("mail::send", WRITE, {"to": "cfo@acme.io", "subject": "Report", "body": "..."}, {"messageId": "<77a2@mail.acme.io>"})
    t.add("mail::send", WRITE, {"to": "cto@acme.io", "subject": "Report", "body": "..."}, {"messageId": "<77a3@mail.acme.io>"})
    t.add("chat::reply", WRITE, {"text": "sent to the three execs"}, {"ok": True})
    t.reason = "A send fails on a bad address; the agent looks the address up and sends to the right one, then to two others."
    out.append(t)
    return out


# ---------------------------------------------------------------- checks and output
def to_json(t, family_name, n):
    d = {
        "id": f"{family_name}-{n:02d}",
        "family": family_name,
        "label": t.label,
        "reason": t.reason,
        "earliestStop": t.earliest,
        "latestStop": t.latest,
        "tools": t.tools,
        "calls": t.calls,
    }
    return d


def check(d):
    errs = []
    calls = d["calls"]
    if not 6 <= len(calls) <= 25:
        errs.append(f"{len(calls)} calls")
    used = {c["tool"] for c in calls}
    if used != set(d["tools"]):
        errs.append("tools map differs from the tools used")
    for name, spec in d["tools"].items():
        if name.count("::") != 1 or spec["risk"] not in (READ, WRITE, CMD):
            errs.append(f"bad tool {name}")
    prev = -1
    for c in calls:
        if c["atMs"] < prev:
            errs.append("atMs goes back")
        prev = c["atMs"]
        if ("result" in c) == ("error" in c):
            errs.append("needs exactly one of result/error")
    if not d["reason"]:
        errs.append("no reason")
    if d["label"] == "loop":
        e, l = d["earliestStop"], d["latestStop"]
        if e is None or l is None or not 0 < e <= l < len(calls):
            errs.append(f"bad stops {e} {l}")
    elif d["label"] == "productive":
        if d["earliestStop"] is not None or d["latestStop"] is not None:
            errs.append("productive trace with stops")
    else:
        errs.append("bad label")
    return errs


def main():
    totals = Counter()
    bad = False
    for name, fn in FAMILIES.items():
        traces = [to_json(t, name, i + 1) for i, t in enumerate(fn())]
        for d in traces:
            errs = check(d)
            if errs:
                bad = True
                print(d["id"], errs, file=sys.stderr)
            totals[(name, d["label"])] += 1
        with open(os.path.join(HERE, f"{name}.json"), "w") as f:
            json.dump(traces, f, indent=1)
            f.write("\n")
    for name in FAMILIES:
        print(f"{name:22} loop {totals[(name, 'loop')]:3}  productive {totals[(name, 'productive')]:3}")
    print(f"{'total':22} loop {sum(v for (n, l), v in totals.items() if l == 'loop'):3}  productive {sum(v for (n, l), v in totals.items() if l == 'productive'):3}")
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
