"""The `refengine` command."""

import logging

import click

from refengine.entrypoints.cli_serve import serve_command
from refengine.oracle.command import oracle_command
from refengine.sampling_params import SamplingParams
from refengine.train.command import train_drafter_command


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log engine decisions (async resolution, head loading).")
def main(verbose: bool) -> None:
    """A reference engine for async scheduling with speculative decoding."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(name)s: %(message)s")


@main.command()
@click.option("--model", default="smollm2", show_default=True, help="smollm2 (embedded), a .gguf file or an HF folder.")
@click.option("--prompt", required=True, help="The prompt text.")
@click.option("--chat", is_flag=True, help="Wrap the prompt as a user message in the model's chat template.")
@click.option("--max-tokens", default=64, show_default=True, type=click.IntRange(min=1))
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(min=0.0), help="0 is greedy.")
@click.option("--seed", default=None, type=int, help="Per-request seed for temperature > 0.")
@click.option("--batch-invariant/--fast", default=True, show_default=True, help="Numerics mode.")
def generate(model: str, prompt: str, chat: bool, max_tokens: int, temperature: float, seed: int | None,
             batch_invariant: bool) -> None:
    """Print the model's continuation of PROMPT."""
    from refengine.engine.llm import LLM
    from refengine.tokenizer.chat_template import ChatMessage

    llm = LLM(model, numerics="batch_invariant" if batch_invariant else "fast", max_num_seqs=1)
    if chat:
        prompt = llm.tokenizer.apply_chat_template([ChatMessage("user", prompt)])
        ids = llm.tokenizer.encode(prompt, add_special_tokens=False)
    else:
        ids = llm.tokenizer.encode(prompt)
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
    (out,) = llm.generate([ids], params)
    click.echo(out.text)


main.add_command(serve_command)
main.add_command(oracle_command)
main.add_command(train_drafter_command)


if __name__ == "__main__":
    main()
