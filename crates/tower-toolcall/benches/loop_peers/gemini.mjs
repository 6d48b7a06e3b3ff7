// Replays the loop corpus through Gemini CLI's LoopDetectionService, as shipped in
// @google/gemini-cli-core, and writes one JSON line per trace: {"id", "stoppedAt"}.
//
// Usage: node gemini.mjs <corpus dir> <out.jsonl>
//
// How Gemini CLI drives it (dist/src/core/client.js, sendMessageStream): the service is
// reset once per user prompt, turnStarted() runs before every model turn, and every event
// of the model's stream goes through addAndCheck() before it is acted on. A tool call
// request whose addAndCheck() reports a loop is not executed: the first detection sends
// the model a "Potential loop detected" message instead, the second ends the turn. The
// first refused call is therefore the first call whose request addAndCheck() flags.
// Tool results are never shown to the service (it looks at name and arguments only).
// turnStarted() consults the LLM judge only from the 30th turn of a prompt; corpus traces
// have at most 25 calls, and the driver never calls turnStarted(), so no model is used.
import { readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { LoopDetectionService } from '@google/gemini-cli-core/dist/src/services/loopDetectionService.js';
import { GeminiEventType } from '@google/gemini-cli-core/dist/src/core/turn.js';

const [corpusDir, outPath] = process.argv.slice(2);
if (!corpusDir || !outPath) {
  console.error('usage: node gemini.mjs <corpus dir> <out.jsonl>');
  process.exit(2);
}

// The service reads only these from its context: loop detection not disabled, usage
// statistics off (so no telemetry is sent anywhere).
const config = {
  getDisableLoopDetection: () => false,
  getUsageStatisticsEnabled: () => false,
  getDebugMode: () => false,
  getTelemetryEnabled: () => false,
  getSessionId: () => 'corpus-replay',
};

const lines = [];
for (const file of readdirSync(corpusDir).filter((f) => f.endsWith('.json')).sort()) {
  for (const trace of JSON.parse(readFileSync(join(corpusDir, file), 'utf8'))) {
    const service = new LoopDetectionService({ config });
    service.reset(`prompt-${trace.id}`, 'task');
    let stoppedAt = null;
    for (const [i, call] of trace.calls.entries()) {
      const event = {
        type: GeminiEventType.ToolCallRequest,
        value: {
          callId: `call-${i}`,
          name: call.tool,
          args: call.args,
          isClientInitiated: false,
          prompt_id: `prompt-${trace.id}`,
        },
      };
      if (service.addAndCheck(event).count > 0) {
        stoppedAt = i;
        break;
      }
    }
    lines.push(JSON.stringify({ id: trace.id, stoppedAt }));
  }
}
writeFileSync(outPath, lines.join('\n') + '\n');
console.error(`gemini: ${lines.length} traces replayed`);
