"""[Note: tables at 80 columns] in rrfp_cli.output, the pieces: a command to copy, broken into lines that paste as
the same command, and a column wider than the terminal, folded and never cut. Every command's tables at 80
columns: tests/inproc/test_tables_80.py and tests/multiproc/test_tables_80.py."""

from __future__ import annotations

from rich.cells import cell_len

from rrfp_cli.output import Column, shell_lines


def test_shell_lines_paste_as_the_same_command():
    import shlex

    command = shlex.join(["rrfp", "simulate", "--durations", "a file.csv", *(["--stages", "4"] * 12)])
    lines = shell_lines(command, 40)
    assert max(map(len, lines.splitlines())) <= 40
    assert shlex.split(lines.replace("\\\n", " ")) == shlex.split(command)


def test_a_column_wider_than_the_terminal_folds_and_never_cuts():
    import io

    from rich.console import Console

    from rrfp_cli.output import print_table

    console = Console(file=io.StringIO(), width=30)
    print_table(console, [Column("name", text=True, key=True), Column("value")],
                [["x" * 40, "12345.678"], ["short", "1"]], title="a title longer than thirty columns, wrapped")
    text = console.file.getvalue()
    assert "…" not in text and "12345.678" in text
    assert max(map(cell_len, text.splitlines())) <= 30
