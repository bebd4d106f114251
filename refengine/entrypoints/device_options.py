"""The device flags that `refengine serve` and `refengine generate` share, and their one-line errors."""

import click

DEVICES = ("cuda", "cpu")


def device_options(command):
    """--device and --cuda-graphs/--no-cuda-graphs; None leaves each to the engine (the weights' device;
    graphs on when that is a GPU with Triton attention)."""
    command = click.option(
        "--cuda-graphs/--no-cuda-graphs",
        default=None,
        help="Replay decode and verify steps from CUDA graphs. Default: on for a GPU with Triton attention.",
    )(command)
    return click.option(
        "--device",
        type=click.Choice(DEVICES),
        default=None,
        help="Where the model and KV cache live. Default: where the model's weights load (random: models on "
        "a GPU when one is visible, files on the CPU).",
    )(command)


def tensor_parallel_options(command):
    """--tensor-parallel-size (vLLM's name) and --tp-invariant."""
    command = click.option(
        "--tp-invariant",
        is_flag=True,
        help="With --batch-invariant: row-parallel products sum in a fixed tree whatever the TP size, so "
        "float32 logits are bitwise equal at every --tensor-parallel-size (slower).",
    )(command)
    return click.option(
        "--tensor-parallel-size",
        type=click.IntRange(min=1),
        default=1,
        show_default=True,
        help="Shard the model over this many ranks (processes: GPUs 0..N-1 with --device cuda, gloo on the "
        "CPU). Must divide the attention heads, KV heads, vocabulary and intermediate size.",
    )(command)


def check_device(device: str | None, cuda_graphs: bool | None) -> None:
    """Refuse, before loading anything, a device this machine lacks or graphs the CPU cannot replay."""
    if device == "cpu" and cuda_graphs:
        raise click.ClickException("--cuda-graphs needs a GPU: drop it or use --device cuda")
    if device == "cuda":
        import torch  # here, not at the top: the command group stays cheap to load

        if not torch.cuda.is_available():
            raise click.ClickException("--device cuda: no CUDA device is visible on this machine")
