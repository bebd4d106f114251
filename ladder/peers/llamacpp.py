"""llama.cpp's server as a peer engine, started through xllamacpp's Python API (it has no command line).

    python -m ladder.peers.llamacpp --gguf PATH --port P --slots N --ctx-per-slot L --threads 2

Slots are llama.cpp's concurrent sequences: give at least the ladder's largest c, and a context per slot of
at least input + output tokens (plus the chat template); llama.cpp pads it up to a multiple of 256
(`python -m ladder.peers.llamacpp --slot-context L` prints what a slot of L really gets). The server listens on 127.0.0.1:P until SIGTERM
or SIGINT. Settings that would make it measure something other than what refengine measures are pinned:
no prompt cache (refengine has none), and neutral sampling defaults (top-k, top-p and min-p off), so a
request's own sampling parameters mean what they mean on an OpenAI server.
"""

import argparse
import signal
import sys
import threading
from importlib.metadata import PackageNotFoundError, version

ENGINE = "llama.cpp"
SLOT_CONTEXT_PAD = 256  # llama.cpp pads each sequence's context (n_ctx_seq) up to a multiple of this


def slot_context(ctx_per_slot: int) -> int:
    """The context one slot really has: llama.cpp pads n_ctx / n_parallel up to a multiple of 256 (its log
    says "n_ctx is not divisible by n_seq_max"), so --ctx-per-slot 384 gives 512, as its /props n_ctx says."""
    return -(-ctx_per_slot // SLOT_CONTEXT_PAD) * SLOT_CONTEXT_PAD


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ladder.peers.llamacpp", description=__doc__.split("\n\n")[0])
    p.add_argument("--gguf", required=True, help="The GGUF weight file.")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--slots", type=int, default=4, help="Concurrent sequences (llama.cpp's n_parallel).")
    p.add_argument("--ctx-per-slot", type=int, default=512, help="Context tokens per slot.")
    p.add_argument("--threads", type=int, default=2, help="CPU threads for generation and prompt batches.")
    p.add_argument("--kv-type", choices=["f16", "f32", "bf16", "q8_0"], default="f16",
                   help="KV cache element type (llama.cpp's default is f16).")
    return p.parse_args(argv)


def _weight_format(gguf_path: str) -> str | None:
    """The file's declared quantisation (general.file_type), as refengine reports it."""
    try:
        import gguf

        field = gguf.GGUFReader(gguf_path).get_field("general.file_type")
        return gguf.LlamaFileType(int(field.parts[-1][0])).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (ImportError, OSError, ValueError, AttributeError, IndexError):
        return None


def engine_keys(argv: list[str]) -> dict[str, object]:
    """The like-for-like engine keys this launcher's flags imply (ladder's --serve-cmd parser calls it)."""
    try:
        args = parse_args(argv)
    except SystemExit:  # flags this launcher would refuse: say nothing rather than guess
        return {}
    try:
        engine_version = f"xllamacpp {version('xllamacpp')}"
    except PackageNotFoundError:
        engine_version = None
    fmt = _weight_format(args.gguf)
    return {
        "engine": ENGINE, "engine_version": engine_version, "weights": args.gguf, "weight_format": fmt,
        # ggml multiplies quantised weights in their own format (activations requantised to match) rather
        # than dequantising them first: the compute is the format's kernels, not a float dtype.
        "dtype": f"{fmt} kernels" if fmt and fmt.startswith(("Q", "IQ")) else fmt,
        "kv_dtype": args.kv_type, "spec_method": "none", "spec_k": 0,
        # one host loop schedules and computes each step in turn: nothing overlaps the next schedule
        "async_scheduling": False,
        "max_model_len": slot_context(args.ctx_per_slot), "max_num_seqs": args.slots,
    }


def serve(args: argparse.Namespace) -> None:
    import xllamacpp as xlc

    params = xlc.CommonParams()
    params.model.path = args.gguf
    params.hostnames = [args.host]
    params.port = args.port
    params.n_parallel = args.slots
    params.n_ctx = args.slots * args.ctx_per_slot  # split evenly over the slots (kv_unified stays off)
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    kv = getattr(xlc.ggml_type, f"GGML_TYPE_{args.kv_type.upper()}")
    params.cache_type_k = params.cache_type_v = kv
    params.cache_prompt = False
    params.endpoint_metrics = True
    params.sampling.top_k = 0
    params.sampling.top_p = 1.0
    params.sampling.min_p = 0.0
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = xlc.Server(params)  # loads the model and starts listening; blocks until ready
    print(f"llama.cpp listening on {server.listening_address}", flush=True)
    stop.wait()
    del server  # joins llama.cpp's loop and HTTP threads before the interpreter exits


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--slot-context"]:  # for scripts that state the budget each engine really has
        print(slot_context(int(argv[1])))
        return
    serve(parse_args(argv))


if __name__ == "__main__":
    main()
