// Replays the loop corpus through Cline's loop detection as shipped in @cline/core, and
// writes one JSON line per trace: {"id", "stoppedAt"}.
//
// Usage: node cline.mjs <corpus dir> <out.jsonl>
//
// Cline's detectors are two classes private to its session runtime (SessionRuntime, which
// @cline/core exports as a type only): LoopDetectionTracker (`GW` in the 0.0.86 bundle:
// consecutive identical calls, same tool name and same input with keys sorted; a warning
// message at 3, a stop at 5) and MistakeTracker (`UW`: a turn whose tool calls all failed is
// a mistake, a turn with a success resets the count; the run stops at 6, and a loop stop
// is recorded "at the limit"). Reaching them through the runtime would need a model
// provider, so this driver takes their code verbatim from the installed bundle (between
// the markers below; it fails if they are missing) and wires them exactly as
// SessionRuntime does: inspect() on each "tool-started" event, mistakes on
// "turn-finished". Tool results are never shown to the loop tracker.
//
// A stop lands while the call that triggered it is already running: the runtime emits
// "tool-started", then calls the tool, and the tracker's abort arrives asynchronously,
// so that call's side effect happens. The first call not executed is the next one; a stop
// on the last call of a trace refuses nothing and is written as null.
import { readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

const [corpusDir, outPath] = process.argv.slice(2);
if (!corpusDir || !outPath) {
  console.error('usage: node cline.mjs <corpus dir> <out.jsonl>');
  process.exit(2);
}

const here = dirname(fileURLToPath(import.meta.url));
const bundle = readFileSync(join(here, 'node_modules/@cline/core/dist/index.js'), 'utf8');
const start = bundle.indexOf('function eb(){');
const end = bundle.indexOf('function Wk(', start);
const src = start >= 0 && end > start ? bundle.slice(start, end) : '';
if (!src.includes('class GW{') || !src.includes('class UW{') || !src.includes('softThreshold:3,hardThreshold:5')) {
  console.error('cline: the loop tracker was not found in @cline/core/dist/index.js (another version?)');
  process.exit(1);
}
const { GW: LoopDetectionTracker, UW: MistakeTracker } = new Function(`${src}; return { GW, UW };`)();
// SessionRuntime's default: execution.maxConsecutiveMistakes ?? 6
const MAX_CONSECUTIVE_MISTAKES = 6;

async function replay(trace) {
  // execution.loopDetection undefined: enabled, default thresholds
  const loopTracker = new LoopDetectionTracker(undefined);
  const mistakes = new MistakeTracker({
    maxConsecutiveMistakes: MAX_CONSECUTIVE_MISTAKES,
    onLimitReached: undefined,
    emit: () => {},
    log: () => {},
    agentId: 'replay',
    getConversationId: () => trace.id,
    getActiveRunId: () => 'run',
    appendRecoveryNotice: () => {},
  });
  const n = trace.calls.length;
  const after = (i) => (i + 1 < n ? i + 1 : null);
  for (const [i, call] of trace.calls.entries()) {
    // "tool-started": inspectLoopForToolCall
    const verdict = loopTracker.inspect({ name: call.tool, input: call.args });
    if (verdict.kind === 'hard') {
      const r = await mistakes.record({ iteration: i, reason: 'tool_execution_failed', forceAtLimit: true, details: verdict.message });
      if (r.action === 'stop') return after(i);
    }
    // "turn-finished": one call per turn here
    if ('error' in call) {
      const r = await mistakes.record({ iteration: i, reason: 'tool_execution_failed', details: `1 tool call(s) failed: [${call.tool}] ${call.error.message}` });
      if (r.action === 'stop') return after(i);
    } else {
      mistakes.reset();
    }
  }
  return null;
}

const lines = [];
for (const file of readdirSync(corpusDir).filter((f) => f.endsWith('.json')).sort()) {
  for (const trace of JSON.parse(readFileSync(join(corpusDir, file), 'utf8'))) {
    lines.push(JSON.stringify({ id: trace.id, stoppedAt: await replay(trace) }));
  }
}
writeFileSync(outPath, lines.join('\n') + '\n');
console.error(`cline: ${lines.length} traces replayed`);
