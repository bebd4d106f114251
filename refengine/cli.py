"""The `refengine` command. Each subcommand's module is imported only when that subcommand runs, so
`refengine --help` loads neither torch nor the HTTP server, and `refengine oracle` runs where uvicorn
is not installed."""

import importlib
import logging
import sys

import click

# name -> (module, attribute, the one-line help `refengine --help` lists without importing the module)
SUBCOMMANDS = {
    "generate": ("refengine.entrypoints.cli_generate", "generate_command", "Print the model's continuation of PROMPT."),
    "serve": ("refengine.entrypoints.cli_serve", "serve_command", "Serve MODEL over the OpenAI API."),
    "oracle": ("refengine.oracle.command", "oracle_command", "The token-identity oracle over the scheduling x drafting matrix."),
    "train-drafter": ("refengine.train.command", "train_drafter_command", "Train a drafter head by self-distillation."),
    "draft-vocab": ("refengine.train.draft_vocab", "draft_vocab_command", "Give an EAGLE3 head a reduced draft vocabulary."),
    "export-prompts": ("refengine.train.sharegpt", "export_prompts_command", "Write ShareGPT's human turns for train-drafter."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in SUBCOMMANDS:
            return None
        module, attribute, _ = SUBCOMMANDS[cmd_name]
        return getattr(importlib.import_module(module), attribute)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, SUBCOMMANDS[name][2]) for name in self.list_commands(ctx)])

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except Exception as e:
            # A missing or unreadable model file is one line, whichever command met it. The error class is
            # looked up, not imported: the model package loads torch, and a command that never loaded it
            # cannot have raised it.
            errors = sys.modules.get("refengine.model.errors")
            if errors is not None and isinstance(e, errors.ModelLoadError):
                raise click.ClickException(str(e)) from None
            raise


@click.group(cls=LazyGroup)
@click.version_option(package_name="specladder", prog_name="refengine")
@click.option("-v", "--verbose", is_flag=True, help="Log engine decisions (async resolution, head loading).")
def main(verbose: bool) -> None:
    """A reference engine for async scheduling with speculative decoding."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(name)s: %(message)s")


if __name__ == "__main__":
    main()
