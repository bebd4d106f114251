"""The server as the ladder sees it over HTTP: model list, health, canary, probes and /metrics counters."""

import base64
import json
import re
from time import perf_counter

import aiohttp
import yarl

from ladder.client import Progress, Target, request_body, stream
from ladder.config import SetupError
from ladder.metrics import SPEC_COUNTERS, parse_counters, progress_counters
from ladder.prefix_cache import PREFIX_CACHE_COUNTERS
from ladder.records import RequestRecord, probe_failure
from ladder.redact import redact_url
from ladder.rung import SHUTTING_DOWN

CANARY_TRIES, CANARY_FAILS = 3, 2  # 2 of 3 failed canaries mean the engine is dead


class NotReadyError(SetupError):
    """Nothing usable answers at the base URL yet: no connection, or a 5xx while the server starts."""


class Endpoint:
    """One OpenAI-compatible server and the HTTP session every request to it shares."""

    def __init__(self, base_url: str, api_key: str | None, chat: bool, headers: dict[str, str] | None = None,
                 insecure: bool = False, key_source: str | None = None):
        shown = redact_url(base_url.rstrip("/"))
        if not shown.startswith(("http://", "https://")):
            raise SetupError(f"base URL {shown!r} has no scheme: write http://{shown} or https://{shown}")
        if (path := re.search(r"(/v1)?/(chat/completions|completions|models)$", shown)) is not None:
            raise SetupError(f"base URL {shown!r} names an endpoint, not the server: write {shown[:path.start()]} "
                             f"(--backend picks /v1/chat/completions or /v1/completions)")
        # NOTE: userinfo (user:password@) becomes Basic auth and leaves the URL, so that no message that
        # names a URL can carry the password.
        url = yarl.URL(base_url.rstrip("/"))
        self._headers = {"Content-Type": "application/json"}
        if url.user is not None or url.password is not None:
            basic = base64.b64encode(f"{url.user or ''}:{url.password or ''}".encode()).decode()
            self._headers["Authorization"] = f"Basic {basic}"  # RFC 7617
        url = str(url.with_user(None))
        self.base_url = url[:-3] if url.endswith("/v1") else url  # accept either spelling of the base
        self.chat = chat
        self.path = "/v1/chat/completions" if chat else "/v1/completions"
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._headers.update(headers or {})
        self._key = self._describe_key(headers or {}, api_key, key_source)
        self._insecure = insecure
        self.session: aiohttp.ClientSession | None = None

    @staticmethod
    def _describe_key(headers: dict[str, str], api_key: str | None, source: str | None) -> tuple[str, str]:
        """(the credential the server may refuse, named by where it came from; what to do instead)."""
        if any(k.lower() == "authorization" for k in headers):
            return "the Authorization header given with --header", "check its value"
        if not api_key:
            return "a request without an API key", "pass --api-key or set OPENAI_API_KEY"
        if source == "OPENAI_API_KEY":
            return "the API key from $OPENAI_API_KEY", "fix the variable, or pass --api-key"
        return f"the API key given with {source or '--api-key'}", "check it"

    async def __aenter__(self) -> "Endpoint":
        # NOTE: no connection cap (the phase semaphore is the cap) so probes never queue behind load;
        # a 1 MiB read buffer keeps long chunks from throttling the stream (vllm#39963). One connection
        # per request (force_close), as SGLang's client does: llama.cpp's server closes a kept-alive
        # connection 5 s after it read the request on it, so after any longer stream the next request on
        # that connection fails with "Can not write request body", and a POST is never retried. The
        # price is a loopback connect inside each TTFT (~0.1 ms).
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=True, ssl=False if self._insecure else True),
            headers=self._headers,
            read_bufsize=1 << 20,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        return self

    async def __aexit__(self, *exc) -> None:
        await self.session.close()

    @property
    def target(self) -> Target:
        return Target(self.session, self.base_url + self.path, self.chat)

    async def models(self) -> list[dict]:
        """The /v1/models entries; any answer other than a model list is a SetupError."""
        url = self.base_url + "/v1/models"
        try:
            async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=30)) as resp:
                text = await resp.text(errors="replace")
                if resp.status in (401, 403):
                    what, advice = self._key
                    raise SetupError(f"{url} refused {what} (HTTP {resp.status}); {advice}")
                if resp.status >= 500:
                    raise NotReadyError(f"{url} answered HTTP {resp.status}: {text[:100]}")
                if resp.status != 200:
                    raise SetupError(f"{url} answered HTTP {resp.status}: not an OpenAI-compatible server?")
                try:
                    data = (await resp.json(content_type=None))["data"]
                except (ValueError, KeyError, TypeError):
                    data = None
                if not isinstance(data, list):
                    raise SetupError(f"{url} returned no model list ({text[:60]!r}): "
                                     f"not an OpenAI-compatible server?")
                return data
        except (aiohttp.ClientError, TimeoutError) as e:
            raise NotReadyError(f"cannot reach {url}: {type(e).__name__}: {e}") from e

    async def health(self) -> str | None:
        """Why /health says the engine is gone, or None. A server without /health (404) is not dead; one
        that answers 503 "shutting down" is draining, and said so."""
        try:
            async with self.session.get(self.base_url + "/health",
                                        timeout=aiohttp.ClientTimeout(total=10)) as resp:
                if resp.status < 500:
                    return None
                text = (await resp.text(errors="replace")).strip().replace("\n", " ")
                if resp.status == 503 and re.search(r"shutting[ _]down", text, re.IGNORECASE):
                    return f"{SHUTTING_DOWN} (/health answered HTTP 503: {text[:100]})"
                return f"/health answered HTTP {resp.status}"
        except (aiohttp.ClientError, TimeoutError) as e:
            return f"/health unreachable: {type(e).__name__}: {e}"

    async def optional_text(self, path: str) -> str:
        """The body of GET path, or "" when the server does not serve it."""
        try:
            async with self.session.get(self.base_url + path, timeout=aiohttp.ClientTimeout(total=10)) as resp:
                return await resp.text(errors="replace") if resp.status == 200 else ""
        except (aiohttp.ClientError, TimeoutError):
            return ""

    async def reset_prefix_cache(self) -> str:
        """vLLM's POST /reset_prefix_cache, so that a repeat starts as cold as the first run: "reset", "refused"
        (the server answered, but not 200: busy, say) or "not offered" (no such route, or no answer)."""
        try:
            async with self.session.post(self.base_url + "/reset_prefix_cache",
                                         timeout=aiohttp.ClientTimeout(total=30)) as resp:
                if resp.status in (404, 405):
                    return "not offered"
                return "reset" if resp.status == 200 else "refused"
        except (aiohttp.ClientError, TimeoutError):
            return "not offered"

    async def optional_json(self, path: str) -> dict:
        """The JSON object at GET path, or {} when the server does not serve one (llama.cpp's /props)."""
        try:
            data = json.loads(await self.optional_text(path) or "{}")
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    async def counters(self) -> dict[str, float]:
        """The spec-decode and prefix-cache counters from /metrics; empty when the server exposes none."""
        return parse_counters(await self.optional_text("/metrics"), SPEC_COUNTERS + PREFIX_CACHE_COUNTERS)

    async def progress_counters(self) -> dict[str, float]:
        """Every counter of /metrics (ladder.metrics.progress_counters); empty without /metrics."""
        return progress_counters(await self.optional_text("/metrics"))

    async def probe(self, body: bytes, timeout_s: float) -> RequestRecord:
        rec = RequestRecord(concurrency=0, phase="probe", index=0)
        await stream(self.target, body, rec, Progress(perf_counter()), timeout_s)
        return rec

    async def canary(self, model: str, timeout_s: float) -> str | None:
        """Why 1-token completions failed, or None: catches an engine that stopped behind a live HTTP
        front, which /health and /v1/models miss (vllm#1492). One failure can be a flaky but live server,
        so the canary is tried up to CANARY_TRIES times and only CANARY_FAILS failures mean dead."""
        body = request_body("ping", model=model, chat=self.chat, max_tokens=1, temperature=0.0,
                            continuous_usage=False)
        errors = []
        for tries in range(1, CANARY_TRIES + 1):
            err = probe_failure(await self.probe(body, timeout_s))
            if err:
                errors.append(err)
            if len(errors) >= CANARY_FAILS:
                return f"canary failed {len(errors)} of {tries} tries: {errors[0]}"
            if tries - len(errors) > CANARY_TRIES - CANARY_FAILS:
                return None  # too many successes left for the failures to reach CANARY_FAILS
        return None

    async def check_alive(self, model: str, timeout_s: float) -> str | None:
        """Why the engine is dead, or None: /health first (cheap), then the canary."""
        return await self.health() or await self.canary(model, timeout_s)

