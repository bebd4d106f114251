"""The soak's pass/fail checks, from the client's tally, the final /metrics and the samples."""

from .config import SoakConfig
from .load import Tally, Timing
from .observe import fmt_ms, percentile, total

MIN_WINDOW_REQUESTS = 20  # finished requests a window needs for its p99 TPOT to be compared


def verdicts(config: SoakConfig, tally: Tally, final: dict[str, float], samples: list[dict], timings: list[Timing]) -> list[dict]:
    def check(name: str, ok: bool, detail: str) -> dict:
        return {"check": name, "ok": bool(ok), "detail": detail}

    completed = sum(tally.completed.values())
    success = total(final, "vllm:request_success_total")
    disconnects = final.get("refengine:request_aborted_total[reason=client_disconnect]", 0)
    generated = final["vllm:generation_tokens_total"]
    in_use = final["refengine:kv_cache_total_blocks"] - final["refengine:kv_cache_free_blocks"]
    rejected = final.get("refengine:request_rejected_total[reason=queue_full]", 0)
    out = [
        check("no 5xx", not tally.server_errors, f"server errors: {dict(tally.server_errors) or 0}"),
        check("no transport errors", not tally.transport_errors, f"{dict(tally.transport_errors) or 0}"),
        check("no KV block leaked", in_use == 0 and final["refengine:requests_in_flight"] == 0,
              f"{in_use:.0f} blocks in use, {final['refengine:requests_in_flight']:.0f} requests in flight after the load"),
        # A stream the client closes just as it finishes may count as a success on the server: the two
        # outcomes are compared as a sum, and each bounded by the client's figure.
        check("/metrics: every admitted request counted once",
              success + disconnects == completed + tally.aborted_by_client
              and success >= completed and disconnects <= tally.aborted_by_client,
              f"server {success:.0f} finished + {disconnects:.0f} disconnects; "
              f"client {completed} finished + {tally.aborted_by_client} closed"),
        check("/metrics: 429s equal the client's", rejected == tally.refused_429,
              f"server {rejected:.0f}, client {tally.refused_429}"),
        check("/metrics: generation tokens cover what clients were sent",
              generated >= tally.completion_tokens + tally.aborted_seen_tokens
              and (tally.aborted_by_client > 0 or generated == tally.completion_tokens),
              f"server {generated:.0f}; client {tally.completion_tokens} in finished requests "
              f"+ {tally.aborted_seen_tokens} read from closed streams"),
        check("every variant of the mix happened",
              completed and tally.aborted_by_client and sum(tally.malformed.values()) and tally.refused_429
              and tally.slow_reads and tally.bursts,
              f"{completed} finished, {tally.aborted_by_client} closed by the client, "
              f"{sum(tally.malformed.values())} malformed ({dict(tally.malformed)}), {tally.refused_429} refused with 429, "
              f"{tally.slow_reads} slow reads, {tally.bursts} bursts"),
    ]  # fmt: skip
    if config.counts_only:
        return out
    first = [s for s in samples if s["t"] <= config.window_s]
    name = "RSS grows at most 10% after the first window"
    if not first or samples[-1]["t"] < config.window_s:
        out.append(check(name, False, "the run was shorter than one window: nothing to compare"))
    else:
        base, last = first[-1]["rss_mib"], samples[-1]["rss_mib"]
        out.append(check(name, last <= 1.10 * base,
                         f"{base:.0f} MiB at {first[-1]['t']:.0f} s, {last:.0f} MiB at the end ({last / base - 1:+.1%})"))
    end = max((t.end for t in timings), default=0)
    early = [t.tpot for t in timings if t.tpot is not None and t.end <= config.window_s]
    late = [t.tpot for t in timings if t.tpot is not None and t.end >= end - config.window_s]
    name = "p99 TPOT drifts up at most 20% (first window to last)"
    if min(len(early), len(late)) < MIN_WINDOW_REQUESTS:
        # Too few requests for a p99 to mean anything: the check cannot pass, so it fails, saying why.
        out.append(check(name, False, f"too few requests to judge: {len(early)} finished in the first "
                                      f"window, {len(late)} in the last; {MIN_WINDOW_REQUESTS} needed in each"))
    else:
        p_early, p_late = percentile(early, 0.99), percentile(late, 0.99)
        out.append(check(name, p_late <= 1.20 * p_early,
                         f"{fmt_ms(p_early)} -> {fmt_ms(p_late)} ({p_late / p_early - 1:+.1%}) over "
                         f"{len(early)} and {len(late)} requests"))
    return out
