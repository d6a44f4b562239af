#!/usr/bin/python3
"""A Python host for pinnedd's end-to-end tests (e2e/python_test.go).

/jobs/<id>:
    POST /submit?steps=N  append a work item; its run declares itself
                          applied, then takes N steps of 100 ms
    GET  /status          {"deliveries": [resume flags of each run],
                           "steps": steps taken, "done": bool}
    POST /call?path=P     a cluster call: POST P through the node's front
                          door, answered as {"status": ..., "body": ...}
"""

from __future__ import annotations

import asyncio
import json

from pinnedd_sdk import Handlers, Host, Instance, Request, Response, Run, route, serve


async def run_job(run: Run) -> None:
    log = run.instance.tray("log", "~")
    log.set("deliveries", log.get("deliveries", []) + [run.resume])
    await run.applied()
    for item in run.items:
        for _ in range(item.payload["steps"]):
            run.instance.eviction_checkpoint()
            await asyncio.sleep(0.1)
            log.set("steps", log.get("steps", 0) + 1)
    log.set("done", True)
    await run.instance.durable()


class Jobs(Handlers):
    def __init__(self, inst: Instance) -> None:
        self.inst = inst

    @route("POST", "/submit")
    async def submit(self, req: Request) -> Response:
        steps = int(req.query.get("steps", ["1"])[0])
        seqs = await self.inst.tray("jobs", "work").append({"steps": steps})
        self.inst.logger.warning("job submitted", extra={"steps": steps})
        return Response({"seqs": seqs}, 202)

    @route("GET", "/status")
    async def status(self, req: Request) -> dict[str, object]:
        log = self.inst.tray("log", "~")
        return {"deliveries": log.get("deliveries", []), "steps": log.get("steps", 0), "done": log.get("done", False)}

    @route("POST", "/call")
    async def call(self, req: Request) -> dict[str, object]:
        r = await self.inst.cluster.call("POST", req.query["path"][0])
        return {"status": r.status, "body": json.loads(r.body or b"null")}


if __name__ == "__main__":
    serve({"/jobs": Host(new=Jobs, trays={"jobs": run_job})})
