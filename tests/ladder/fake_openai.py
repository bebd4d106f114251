"""A scripted OpenAI-compatible streaming server: the test double for ladder.

Raw asyncio HTTP/1.1 (keep-alive, chunked SSE), so it is fast enough to benchmark the client against and
its timing is known exactly. Run it as a process: `python fake_openai.py --port P --script JSON`; it prints
`ready <port>` on stdout once it listens.

A "load request" is a completion request with max_tokens > 1; probes and canaries (max_tokens == 1) never
count, so a script can name load requests by their arrival serial (0-based) without knowing how many
probes the client sends.

Script keys (all optional):
  model             model id served on /v1/models                                   ("fake-model")
  ttft, gap         seconds before the first content chunk / between content chunks  (0.0, 0.0)
  tokens_per_chunk  tokens carried by each content chunk (the last may carry fewer)  (1)
  usage             "final" | "none": whether include_usage is honoured              ("final")
  continuous        honour stream_options.continuous_usage_stats                     (true)
  reject_continuous answer 400 when continuous_usage_stats is sent                  (false)
  role_prelude      send a role-only first chunk at once                             (true)
  pings             send an SSE comment line before every content chunk              (false)
  split_writes      write each event in two pieces, split inside a multi-byte char   (false)
  api_key           require `Authorization: Bearer <api_key>`                        (null)
  spec_k            expose vLLM spec-decode counters as if every chunk were one verify with k drafts
  spec_usage        with spec_k: the final usage also carries the request's own counts, as refengine's
                    usage.speculative_decoding (vLLM's per-request names)                              (false)
  fail_at, truncate_at, short_at   load serials answered 500 / cut before [DONE] / one token short
  overload_at       load serials answered 429 (the server sheds load)
  slow_at, slow_ttft   load serials whose first content chunk waits slow_ttft seconds instead of ttft
  stop_after        finish with finish_reason "stop" after this many tokens (an EOS); with ignore_eos the
                    EOS is emitted there (id 2, no text) and the stream goes on, as vLLM and refengine do
  stop_eos          with stop_after: the last of those tokens is the EOS, counted in usage but sent without
                    text, as a real model's stop token is
  tls               [certfile, keyfile]: serve HTTPS with this certificate
  canary_fail_at    1-token requests after the first load request (canaries), by their serial, answered 500
  plain_json        answer stream: true with one JSON body (application/json), as a non-streaming server
  die_after         after this many load requests the engine dies ...
  die_mode          ... "exit" (the process exits), "500" (every completion then fails, /health stays 200,
                    like an engine stopped behind a live HTTP front) or "stall" (every stream then freezes)
  exit_after_done   the process exits right after completing this many load requests
  token_ids         honour return_token_ids: chunks carry choices[].token_ids           (true)
  diverge_at        from this output position on, every token differs (text "Ω", id 99)
  tokenizer         count prompt_tokens with this tokenizer.json (the prompt text alone), as a real server
  echo_argv         print the command line at start, as servers log their arguments
  busy_metrics      /metrics has a work counter that moves while the engine lives (frozen once it stalls)
  drain_after       after this many load requests the server drains: completions and /health answer 503
                    "the server is shutting down"
  silent_one_token  1-token requests (probes, canaries) sample a special token: usage counts it, the
                    text skips it, so no chunk carries output (a random model's reserved tokens)
  slow_above        once more than this many load requests are in flight at once, every load request waits
                    slow_ttft for its first chunk until none is in flight: a capacity cliff at a known c
  preempt_at        load serials that count one vLLM preemption when they complete
  require           {field: value} every load request must carry, else 400 (checks what the client sends)

A request with "stream": false gets one JSON answer with usage.

/metrics always exposes vllm:num_requests_running (the load requests in flight), vllm:num_requests_waiting
(0) and the counter vllm:num_preemptions_total.
"""

import argparse
import asyncio
import json
import os
import ssl
import sys
import time

TOKEN_TEXTS = ["é", "日本", " w", "ö", "€"]  # multi-byte UTF-8 on purpose


class FakeServer:
    def __init__(self, script: dict):
        self.s = script
        self.num_load = 0
        self.num_canary = 0
        self.dead = False
        self.stalled = asyncio.Event()
        self.drafts = 0
        self.draft_tokens = 0
        self.accepted = 0
        self.running = 0  # load requests in flight
        self.overloaded = False  # slow_above: past the cliff until the server drains
        self.preemptions = 0
        self.iterations = 0
        self.draining = False
        self.tokenizer = None
        if script.get("tokenizer"):
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_file(script["tokenizer"])

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if not await self.route(method, path, headers, body, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def send_json(self, writer, status: int, obj) -> None:
        data = json.dumps(obj).encode()
        reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 429: "Too Many Requests",
                  500: "Error", 503: "Service Unavailable"}[status]
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n".encode() + data)

    async def route(self, method, path, headers, body, writer) -> bool:
        key = self.s.get("api_key")
        if key and headers.get("authorization") != f"Bearer {key}":
            self.send_json(writer, 401, {"error": {"message": "Incorrect API key provided", "type": "auth"}})
            return True
        if method == "GET" and path == "/v1/models":
            model = {"id": self.s.get("model", "fake-model"), "object": "model", "owned_by": "fake",
                     "max_model_len": 4096}
            self.send_json(writer, 200, {"object": "list", "data": [model]})
        elif method == "GET" and path == "/health":
            if self.draining:
                self.send_json(writer, 503, {"error": {"message": "shutting down", "code": "shutting_down"}})
            else:
                self.send_json(writer, 200, {})
        elif method == "GET" and path == "/metrics":
            text = self.metrics_text().encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
                         + str(len(text)).encode() + b"\r\n\r\n" + text)
        elif method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            return await self.complete(json.loads(body), path.endswith("chat/completions"), writer)
        else:
            self.send_json(writer, 404, {"error": {"message": f"no route {path}"}})
        await writer.drain()
        return True

    def metrics_text(self) -> str:
        text = ("# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{model_name="m"}} {self.running}\n'
                f'vllm:num_requests_waiting{{model_name="m"}} 0\n'
                "# TYPE vllm:num_preemptions counter\n"
                f'vllm:num_preemptions_total{{model_name="m"}} {self.preemptions}\n')
        if self.s.get("busy_metrics"):  # the engine iterates (time-based), until a stall freezes it
            if not self.stalled.is_set():
                self.iterations = int(time.monotonic() * 100)
            text += f"vllm:iteration_tokens_total_count {self.iterations}\n"
        if not self.s.get("spec_k"):
            return text
        return text + (f'vllm:spec_decode_num_drafts_total{{model_name="m"}} {self.drafts}\n'
                f'vllm:spec_decode_num_draft_tokens_total{{model_name="m"}} {self.draft_tokens}\n'
                f'vllm:spec_decode_num_accepted_tokens_total{{model_name="m"}} {self.accepted}\n')

    async def complete(self, req: dict, chat: bool, writer) -> bool:
        s = self.s
        max_tokens = req.get("max_tokens") or req.get("max_completion_tokens") or 16
        opts = req.get("stream_options") or {}
        if s.get("reject_continuous") and "continuous_usage_stats" in opts:
            self.send_json(writer, 400, {"error": {"message": "unknown field continuous_usage_stats"}})
            return True
        serial = None
        if max_tokens == 1 and self.num_load:
            self.num_canary += 1
            if self.num_canary - 1 in s.get("canary_fail_at", ()):
                self.send_json(writer, 500, {"error": {"message": "hiccup"}})
                return True
        if max_tokens > 1:
            serial = self.num_load
            self.num_load += 1
            self.running += 1
            if s.get("slow_above") is not None and self.running > s["slow_above"]:
                self.overloaded = True
            try:
                return await self.complete_load(req, chat, writer, serial)
            finally:
                self.running -= 1
                self.overloaded = self.overloaded and self.running > 0
                if serial in s.get("preempt_at", ()):
                    self.preemptions += 1
        return await self.complete_load(req, chat, writer, serial)

    async def complete_load(self, req: dict, chat: bool, writer, serial: int | None) -> bool:
        s = self.s
        max_tokens = req.get("max_tokens") or req.get("max_completion_tokens") or 16
        opts = req.get("stream_options") or {}
        if serial is not None:
            if s.get("die_after") is not None and serial >= s["die_after"]:
                mode = s.get("die_mode", "exit")
                if mode == "exit":
                    os._exit(1)
                if mode == "stall":
                    self.stalled.set()
                self.dead = mode == "500"
        if serial is not None and s.get("drain_after") is not None and serial >= s["drain_after"]:
            self.draining = True
        if self.draining:
            self.send_json(writer, 503, {"error": {"message": "the server is shutting down and accepts no new "
                                                              "requests", "code": "shutting_down"}})
            return True
        if self.dead or serial in s.get("fail_at", ()):
            self.send_json(writer, 500, {"error": {"message": "request submitted to a stopped engine"}})
            return True
        if serial in s.get("overload_at", ()):
            self.send_json(writer, 429, {"error": {"message": "too many requests", "type": "overloaded"}})
            return True
        missing = {k: v for k, v in s.get("require", {}).items() if req.get(k) != v}
        if serial is not None and missing:
            self.send_json(writer, 400, {"error": {"message": f"expected {missing}"}})
            return True
        if req.get("stream") is False:
            await asyncio.sleep(s.get("ttft", 0.0))
            content = "".join(TOKEN_TEXTS[p % len(TOKEN_TEXTS)] for p in range(max_tokens))
            choice = {"message": {"role": "assistant", "content": content}} if chat else {"text": content}
            self.send_json(writer, 200, {"choices": [{"index": 0, **choice, "finish_reason": "length"}],
                                         "usage": {"prompt_tokens": 10, "completion_tokens": max_tokens}})
            return True
        if s.get("plain_json"):
            self.send_json(writer, 200, {"choices": [{"message": {"content": "hi"}}]})
            return True
        stopped = s.get("stop_after") is not None and not req.get("ignore_eos") and s["stop_after"] < max_tokens
        if stopped:
            max_tokens = s["stop_after"]
        if s.get("short_at") and serial in s["short_at"]:
            max_tokens -= 1
        prompt = (req["messages"][0]["content"] if chat else req["prompt"])
        if self.tokenizer is not None:
            prompt_tokens = len(self.tokenizer.encode(prompt, add_special_tokens=False).ids) + (7 if chat else 1)
        else:
            prompt_tokens = len(prompt.split()) * 4 // 3 + (7 if chat else 1)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        continuous = s.get("continuous", True) and opts.get("continuous_usage_stats")
        usage_final = s.get("usage", "final") == "final" and opts.get("include_usage")

        async def emit(obj) -> None:
            data = b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"
            if s.get("pings"):
                data = b": ping\n\n" + data
            if s.get("split_writes"):
                cut = data.index(b"\xc3") + 1 if b"\xc3" in data else len(data) // 2
                for part in (data[:cut], data[cut:]):
                    writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                    await writer.drain()
                    await asyncio.sleep(0.001)
            else:
                writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                await writer.drain()

        def chunk(delta_text, done_tokens, role=False, finish=None, ids=None):
            if chat:
                delta = {"role": "assistant", "content": ""} if role else {"content": delta_text}
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": delta_text, "finish_reason": finish}
            if ids is not None and req.get("return_token_ids") and s.get("token_ids", True):
                choice["token_ids"] = ids
            obj = {"id": "cmpl-1", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}
            if continuous:
                obj["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": done_tokens,
                                "total_tokens": prompt_tokens + done_tokens}
            return obj

        if chat and s.get("role_prelude", True):
            await emit(chunk("", 0, role=True))
        slow = serial in s.get("slow_at", ()) or (serial is not None and self.overloaded)
        await asyncio.sleep(s.get("slow_ttft", 0.0) if slow else s.get("ttft", 0.0))
        k = s.get("tokens_per_chunk", 1)
        done = 0
        mine = {"num_spec_steps": 0, "num_draft_tokens": 0, "num_accepted_draft_tokens": 0,
                "num_accepted_tokens_per_pos": [0] * s.get("spec_k", 0)}
        while done < max_tokens:
            while self.stalled.is_set():  # a hung engine behind an HTTP front that may still ping
                if s.get("pings"):
                    await emit_raw(writer, b": ping\n\n")
                await asyncio.sleep(0.2)
            n = min(k, max_tokens - done)
            done += n
            if s.get("spec_k"):
                self.drafts += 1
                self.draft_tokens += s["spec_k"]
                self.accepted += n - 1
                mine["num_spec_steps"] += 1
                mine["num_draft_tokens"] += s["spec_k"]
                mine["num_accepted_draft_tokens"] += n - 1
                for pos in range(min(n - 1, s["spec_k"])):
                    mine["num_accepted_tokens_per_pos"][pos] += 1
            positions = range(done - n, done)
            diverged = [p >= s.get("diverge_at", max_tokens) for p in positions]
            eos_at = (s["stop_after"] - 1 if stopped and s.get("stop_eos")
                      else s.get("stop_after") if req.get("ignore_eos") else None)
            eos = [p == eos_at for p in positions]
            text = "".join("" if e else "Ω" if d else TOKEN_TEXTS[p % len(TOKEN_TEXTS)]
                           for p, d, e in zip(positions, diverged, eos))
            if max_tokens == 1 and s.get("silent_one_token"):
                text = ""
            ids = [2 if e else 99 if d else p % len(TOKEN_TEXTS) for p, d, e in zip(positions, diverged, eos)]
            finish = ("stop" if stopped else "length") if done == max_tokens else None
            await emit(chunk(text, done, finish=finish, ids=ids))
            if done < max_tokens:
                gap = s.get("gap", 0.0)
                await asyncio.sleep(gap) if gap else await asyncio.sleep(0)
        if usage_final:
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": done, "total_tokens": prompt_tokens + done}
            if s.get("spec_usage") and mine["num_spec_steps"]:
                usage["speculative_decoding"] = mine
            await emit({"id": "cmpl-1", "choices": [], "usage": usage})
        if s.get("truncate_at") and serial in s["truncate_at"]:
            writer.transport.abort()
            return False
        await emit_raw(writer, b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        if serial is not None and serial + 1 == s.get("exit_after_done"):
            os._exit(1)
        return True


async def emit_raw(writer, data: bytes) -> None:
    writer.write(b"%x\r\n%s\r\n" % (len(data), data))
    await writer.drain()


async def main(port: int, script: dict) -> None:
    if script.get("echo_argv"):
        print("args:", sys.argv, flush=True)
    fake = FakeServer(script)
    context = None
    if script.get("tls"):
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*script["tls"])
    server = await asyncio.start_server(fake.handle, "127.0.0.1", port, ssl=context)
    print("ready", server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--script", default="{}")
    args, _ = parser.parse_known_args()  # other flags (an --api-key in a --serve-cmd test) are ignored
    if sys.platform.startswith("linux") and os.environ.get("FAKE_CPU"):
        os.sched_setaffinity(0, {int(os.environ["FAKE_CPU"])})
    asyncio.run(main(args.port, json.loads(args.script)))
