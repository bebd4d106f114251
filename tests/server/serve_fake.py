"""`refengine serve`'s real command line and uvicorn, over the fake engine: run as a subprocess."""

from fake_engine import FakeAsyncLLM

from refengine.engine.arg_utils import EngineArgs
from refengine.entrypoints.cli_serve import ServeOptions, make_serve_command


def fake_engine(args: EngineArgs, options: ServeOptions) -> FakeAsyncLLM:
    spec = args.speculative_config
    return FakeAsyncLLM(
        model_name=args.model,
        max_model_len=args.max_model_len or 512,
        max_num_seqs=args.max_num_seqs,
        num_blocks=args.num_blocks or 512,
        block_size=args.block_size,
        num_speculative_tokens=0 if spec is None else spec.num_speculative_tokens,
        fault_after_steps=args.fault_after_steps,
    )


if __name__ == "__main__":
    make_serve_command(fake_engine)()
