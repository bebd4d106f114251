"""`refengine serve`'s real command line and uvicorn, over the fake engine: run as a subprocess."""

from fake_engine import FakeAsyncLLM

from refengine.entrypoints.cli_serve import ServeOptions, make_serve_command


def fake_engine(options: ServeOptions) -> FakeAsyncLLM:
    spec = options.speculative_config
    return FakeAsyncLLM(
        model_name=options.model,
        max_model_len=options.max_model_len or 512,
        max_num_seqs=options.max_num_seqs or 16,
        num_blocks=options.num_blocks or 512,
        block_size=options.block_size or 16,
        num_speculative_tokens=0 if spec is None else spec.num_speculative_tokens,
        fault_after_steps=options.fault_after_steps,
    )


if __name__ == "__main__":
    make_serve_command(fake_engine)()
