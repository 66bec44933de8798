"""`kimideploy completion SHELL`: the shell's completion script."""

from __future__ import annotations

import click

SHELLS = ("bash", "zsh", "fish")
COMPLETE_VARIABLE = "_KIMIDEPLOY_COMPLETE"
"""What the script sets when it asks the CLI for completions (click's protocol)."""


@click.command()
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print SHELL's completion script for kimideploy: commands, options, and the project's own
    cluster and drafter names (read from --config, KIMIDEPLOY_CONFIG or ./kimideploy.yaml as
    the command will read them).

    \b
    bash:  eval "$(kimideploy completion bash)"    (in ~/.bashrc)
    zsh:   eval "$(kimideploy completion zsh)"     (in ~/.zshrc)
    fish:  kimideploy completion fish > ~/.config/fish/completions/kimideploy.fish
    """
    from click.shell_completion import get_completion_class

    complete = get_completion_class(shell)
    assert complete is not None  # every name in SHELLS is one click ships
    root = ctx.find_root().command
    click.echo(complete(root, {}, "kimideploy", COMPLETE_VARIABLE).source(), nl=False)
