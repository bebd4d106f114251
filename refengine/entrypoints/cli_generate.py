"""`refengine generate`: one prompt in, its continuation out, through the offline LLM."""

import click

from refengine.engine.arg_utils import EngineArgs
from refengine.entrypoints.device_options import check_device, device_options, tensor_parallel_options
from refengine.sampling_params import SamplingParams


@click.command("generate")
@click.option("--model", default=EngineArgs.model, show_default=True,
              help="smollm2 (embedded), tiny-llama or tiny-qwen3, a .gguf file or an HF folder.")
@click.option("--prompt", required=True, help="The prompt text.")
@click.option("--chat", is_flag=True, help="Wrap the prompt as a user message in the model's chat template.")
@click.option("--max-tokens", default=64, show_default=True, type=click.IntRange(min=1))
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(min=0.0), help="0 is greedy.")
@click.option("--seed", default=None, type=int,
              help="Per-request seed for temperature > 0; 0 is a seed like any other. [default: none]")
@click.option("--batch-invariant/--fast", default=EngineArgs.numerics == "batch_invariant", show_default=True,
              help="Numerics mode.")
@device_options
@click.option("--kv-cache-memory-gib", type=click.FloatRange(min=0, min_open=True), default=EngineArgs.kv_cache_memory_gib,
              show_default=True, help="KV pool size as a memory budget.")
@tensor_parallel_options
@click.option("--enable-prefix-caching/--no-enable-prefix-caching", default=EngineArgs.enable_prefix_caching,
              show_default=True, help="Automatic prefix caching (vLLM's).")
def generate_command(model: str, prompt: str, chat: bool, max_tokens: int, temperature: float, seed: int | None,
                     batch_invariant: bool, device: str | None, cuda_graphs: bool | None,
                     kv_cache_memory_gib: float, tensor_parallel_size: int, tp_invariant: bool,
                     enable_prefix_caching: bool) -> None:
    """Print the model's continuation of PROMPT."""
    if not prompt.strip():
        raise click.ClickException("--prompt is empty: give the text to continue")
    check_device(device, cuda_graphs)
    # Imported here: the command group stays cheap to load (torch comes with the engine).
    from refengine.engine.llm import LLM
    from refengine.tokenizer.chat_template import ChatMessage

    try:
        llm = LLM(model, numerics="batch_invariant" if batch_invariant else "fast", max_num_seqs=1, device=device,
                  cuda_graphs=cuda_graphs, kv_cache_memory_gib=kv_cache_memory_gib,
                  tensor_parallel_size=tensor_parallel_size, tp_invariant=tp_invariant,
                  enable_prefix_caching=enable_prefix_caching)
    except ValueError as e:  # a configuration the engine refuses, with its reason
        raise click.ClickException(str(e)) from None
    if chat:
        prompt = llm.tokenizer.apply_chat_template([ChatMessage("user", prompt)])
        ids = llm.tokenizer.encode(prompt, add_special_tokens=False)
    else:
        ids = llm.tokenizer.encode(prompt)
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
    (out,) = llm.generate([ids], params)
    llm.engine.core.shutdown()  # tensor parallelism's worker ranks end with the engine
    click.echo(out.text)
