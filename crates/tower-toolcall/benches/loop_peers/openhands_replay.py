"""Replays the loop corpus through OpenHands' StuckDetector (openhands-sdk) and writes
one JSON line per trace: {"id", "stoppedAt"}.

Usage: python openhands_replay.py <corpus dir> <out.jsonl> [--errors-raised]

How OpenHands drives it (openhands/sdk/conversation/impl/local_conversation.py, run()):
before every agent step, _check_stuck_or_nudge() first asks get_action_error_nudge()
(on the 3rd identical failing call it adds an environment message and the run goes on),
then is_stuck(); when is_stuck() is true the run stops with status STUCK and the agent's
next action is never taken. The first refused call is therefore the call whose step
follows the first is_stuck() == True, judged on the events of the calls before it.

Each corpus call becomes an ActionEvent and its answer an ObservationEvent, as for an MCP
tool (MCPToolAction with the call's arguments, MCPToolObservation with the answer as JSON
text; a failed call is an MCPToolObservation with is_error, which is what an MCP tool's
error result gives). With --errors-raised, a failed call becomes an AgentErrorEvent
instead, which is what OpenHands records when a tool raises. The model's thought is empty
on every action (identical thoughts, the most favourable case for the detector).

(Not named openhands.py: a script of that name would shadow the openhands package.)
"""

import json
import os
import sys

os.environ.setdefault("LOG_LEVEL", "ERROR")
# Keep LiteLLM (imported by the SDK) off the network and the banner off the output.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")

from openhands.sdk.conversation.stuck_detector import StuckDetector
from openhands.sdk.event import ActionEvent, AgentErrorEvent, MessageEvent, ObservationEvent
from openhands.sdk.llm import Message, MessageToolCall, TextContent
from openhands.sdk.mcp.definition import MCPToolAction, MCPToolObservation


class LinearState:
    """The part of ConversationState the detector reads: the active branch of a
    conversation without forks is all its events, oldest first."""

    def __init__(self):
        self.events = []

    def active_branch(self, limit=None):
        return self.events if limit is None else self.events[-limit:]


def replay(trace, errors_raised):
    state = LinearState()
    state.events.append(MessageEvent(source="user", llm_message=Message(role="user", content=[TextContent(text="task")])))
    detector = StuckDetector(state)
    for i, call in enumerate(trace["calls"]):
        # _check_stuck_or_nudge(), before the step that would issue call i
        nudge = detector.get_action_error_nudge()
        if nudge is not None:
            state.events.append(MessageEvent(source="environment", llm_message=Message(role="user", content=[TextContent(text=nudge)])))
        elif detector.is_stuck():
            return i
        args = json.dumps(call["args"])
        action = ActionEvent(
            thought=[],
            action=MCPToolAction(data=call["args"]),
            tool_name=call["tool"],
            tool_call_id=f"call-{i}",
            tool_call=MessageToolCall(id=f"call-{i}", name=call["tool"], arguments=args, origin="completion"),
            llm_response_id=f"resp-{i}",
        )
        state.events.append(action)
        if "error" in call and errors_raised:
            err = call["error"]
            state.events.append(AgentErrorEvent(error=f"Error executing tool '{call['tool']}': {err['code']}: {err['message']}", tool_name=call["tool"], tool_call_id=f"call-{i}"))
            continue
        if "error" in call:
            text, is_error = f"{call['error']['code']}: {call['error']['message']}", True
        else:
            text, is_error = json.dumps(call["result"], sort_keys=True), False
        obs = MCPToolObservation(content=[TextContent(text=f"[Tool '{call['tool']}' executed.]"), TextContent(text=text)], is_error=is_error, tool_name=call["tool"])
        state.events.append(ObservationEvent(observation=obs, action_id=action.id, tool_name=call["tool"], tool_call_id=f"call-{i}"))
    return None


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    errors_raised = "--errors-raised" in sys.argv
    if len(args) != 2:
        sys.exit("usage: python openhands_replay.py <corpus dir> <out.jsonl> [--errors-raised]")
    corpus, out = args
    n = 0
    with open(out, "w") as f:
        for name in sorted(os.listdir(corpus)):
            if not name.endswith(".json"):
                continue
            with open(os.path.join(corpus, name)) as cf:
                for trace in json.load(cf):
                    f.write(json.dumps({"id": trace["id"], "stoppedAt": replay(trace, errors_raised)}) + "\n")
                    n += 1
    print(f"openhands: {n} traces replayed", file=sys.stderr)


if __name__ == "__main__":
    main()
