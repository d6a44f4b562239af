// The Statewire conformance vectors (statewire/testdata/vectors, see
// statewire/PROTOCOL.md) run against this JavaScript client:
//
//   STATEWIRE_URL=<instance URL of a server declaring "say"> node --test examples/chat/
//
// go test ./examples/chat/ starts such a server and runs this file.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { randomUUID } from "node:crypto";
import { applyOp, postFrames } from "./statewire.mjs";

const vectors = (name) => JSON.parse(readFileSync(new URL(`../../statewire/testdata/vectors/${name}`, import.meta.url)));

// A frame's ops applied the way attach applies them: to a copy, kept only
// if every op applied.
function applyFrame(doc, ops) {
  let next = structuredClone(doc);
  for (const op of ops) next = applyOp(next, op);
  return next;
}

test("ops vectors", async (t) => {
  const { cases } = vectors("ops.json");
  assert.ok(cases.length > 0);
  for (const c of cases) {
    await t.test(c.name, () => {
      const doc = structuredClone(c.doc);
      if (c.error) {
        assert.throws(() => applyFrame(doc, c.ops));
        assert.deepEqual(doc, c.doc, "a refused frame changed the document");
      } else {
        assert.deepEqual(applyFrame(doc, c.ops), c.want);
      }
    });
  }
});

test("frames vectors", async (t) => {
  const url = process.env.STATEWIRE_URL;
  assert.ok(url, "STATEWIRE_URL must name an instance whose server declares the vectors' commands (go test ./examples/chat/ starts one)");
  const { cases } = vectors("frames.json");
  assert.ok(cases.length > 0);
  for (const c of cases) {
    await t.test(c.name, async () => {
      const clientId = "js-" + randomUUID();
      for (const [i, step] of c.steps.entries()) {
        const r = await postFrames(url, { clientId, frames: step.frames, ...step.extra });
        assert.equal(r.status, step.status, `step ${i}: ${r.text}`);
        if (step.answer) assert.deepEqual(r.body, step.answer, `step ${i}`);
        else if (step.expected) assert.equal(r.body?.expected, step.expected, `step ${i}: ${r.text}`);
        if (r.status !== 200) assert.ok(r.body?.error, `step ${i}: an error without a message: ${r.text}`);
      }
    });
  }
});
