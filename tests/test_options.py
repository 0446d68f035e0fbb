"""resnmt.options: one Option declaration gives a model flag, a spec check and a command's field,
which refuse a value with the same words."""
import argparse
from dataclasses import dataclass
from pathlib import Path

import pytest

from resnmt.options import Option, add_to_command, field_options


def parse_error(option: Option, argv, capsys) -> str:
    parser = argparse.ArgumentParser(prog="p", argument_default=argparse.SUPPRESS)
    option.add_to(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(argv)
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("option, text, typed, allowed", [
    (Option("sas_gate_dim", None, kind="int", above=0), "0", 0, "an integer > 0"),
    (Option("skip_lambda", 2.0, kind="number", above=0), "-1", -1.0, "a real number > 0"),
    (Option("beam", 4, kind="int", minimum=1), "0", 0, "an integer >= 1"),
    (Option("lenpen", 0.6, kind="number", minimum=0), "-0.1", -0.1, "a real number >= 0"),
])
def test_one_check_same_words_as_flag_spec_and_command(option, text, typed, allowed, capsys):
    assert parse_error(option, [option.flag, text], capsys) == \
        f"p: error: argument {option.flag}: invalid value '{text}': must be {allowed}"
    assert option.problem(typed) == f"{option.flag} {typed:g} is invalid: it must be {allowed}"
    with pytest.raises(ValueError, match=rf"^{option.flag} '{text}': must be {allowed}$"):
        option.convert(text)


@pytest.mark.parametrize("kind, text", [("int", "2.5"), ("int", "two"), ("int", "True"), ("number", "nan"),
                                        ("number", "inf"), ("number", "x")])
def test_not_a_number_is_refused(kind, text):
    with pytest.raises(ValueError, match=rf"^--n '{text}': must be an? "):
        Option("n", kind=kind).convert(text)


def test_values_are_converted_to_their_kind():
    assert Option("n", kind="int", minimum=0).convert("12") == 12
    assert Option("n", kind="int", minimum=0).convert(3) == 3
    assert Option("x", kind="number").convert("-2.5") == -2.5
    assert Option("p", kind="path").convert("a/b") == Path("a/b")
    assert Option("s", kind="switch").convert(1) is True
    with pytest.raises(ValueError):
        Option("n", kind="int").convert(True)  # a bool is not an integer


def test_choice_words(capsys):
    option = Option("sas_gate", "two_layer", kind="choice", choices=("two_layer", "single_layer"))
    assert option.problem("three") == "--sas-gate 'three': choose one of two_layer, single_layer"
    with pytest.raises(ValueError, match=r"^--sas-gate 'three' is not one of: two_layer single_layer$"):
        option.convert("three")
    assert "invalid choice: 'three'" in parse_error(option, ["--sas-gate", "three"], capsys)


def test_a_model_flag_has_no_argparse_default_and_reads_its_own():
    option = Option("hc_streams", 4, kind="int", above=0, metavar="N", help="streams")
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)  # as fairseq parses model flags
    option.add_to(parser)
    unset = parser.parse_args([])
    assert not hasattr(unset, "hc_streams") and option.read(unset) == 4
    assert option.read(parser.parse_args(["--hc-streams", "2"])) == 2
    switch = Option("hc_dynamic", False, kind="switch")
    switch.add_to(parser)
    assert switch.read(parser.parse_args(["--hc-dynamic"])) is True


def test_a_commands_field_is_the_same_option_named_by_the_field():
    @dataclass
    class Request:
        beam: int = Option(default=4, kind="int", minimum=1, metavar="K", help="beam size").field()
        plain: str = "not an option"

    (beam,) = field_options(Request)
    assert (beam.dest, beam.flag, beam.default, beam.metavar) == ("beam", "--beam", 4, "K")
    assert Request().beam == 4


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="option kind 'float': choose one of switch, int, number, choice, path, str"):
        Option("x", kind="float")


def test_none_passes_only_where_it_is_the_default():
    assert Option("sas_gate_dim", None, kind="int", above=0).problem(None) is None
    assert Option("dyt_alpha_init", 0.5, kind="number", above=0).problem(None) == \
        "--dyt-alpha-init None is invalid: it must be a real number > 0"


def test_a_commands_options_take_their_defaults_and_argparse_checks_them(capsys):
    """A command's Options on its parser: an operand, a default, a flag alone taking its const."""
    options = (Option("checkpoint", kind="path", positional=True, help="a checkpoint"),
               Option("n", 3, "sentences", kind="int", minimum=1, metavar="N"),
               Option("level", kind="choice", choices=("side", "layer"), nargs="?", const="side", metavar="LEVEL"),
               Option("cpu", False, "on the CPU", kind="switch"))
    parser = argparse.ArgumentParser(prog="p")
    add_to_command(parser, options)
    args = parser.parse_args(["ck.pt"])
    assert (args.checkpoint, args.n, args.level, args.cpu) == (Path("ck.pt"), 3, None, False)
    args = parser.parse_args(["ck.pt", "--n", "7", "--level", "--cpu"])
    assert (args.n, args.level, args.cpu) == (7, "side", True)
    with pytest.raises(SystemExit):
        parser.parse_args(["ck.pt", "--n", "0"])
    assert capsys.readouterr().err.splitlines()[-1] == "p: error: argument --n: invalid value '0': must be an integer >= 1"


def test_a_value_kept_as_text_is_converted_with_the_flags_words():
    option = Option("n", 3, kind="int", minimum=1)
    parser = argparse.ArgumentParser()
    add_to_command(parser, (option,), checked=False)
    text = parser.parse_args(["--n", "0"]).n
    assert text == "0"
    with pytest.raises(ValueError, match=r"^--n '0': must be an integer >= 1$"):
        option.convert(text)


def test_a_check_of_its_own_and_an_environment_default(monkeypatch):
    def even(text):
        if int(text) % 2:
            raise ValueError(f"'{text}' is odd: expected an even number")
        return text

    option = Option("pairs", "2", parse=even, env="TEST_PAIRS")
    with pytest.raises(ValueError, match=r"^--pairs '3' is odd: expected an even number$"):
        option.convert("3")
    assert option.command_default() == "2"
    monkeypatch.setenv("TEST_PAIRS", "4")
    assert option.command_default() == "4"
    with pytest.raises(ValueError, match="a check of its own"):
        Option("n", kind="int", parse=even)


def test_a_help_line_names_the_default_and_the_environment_variable():
    from resnmt.experiment.command_options import options_help

    out = Option("out", "runs/demo", "runs and tables", metavar="DIR", env="DEMO_OUT")
    assert options_help([out], indent=20) == "  --out DIR         runs and tables (default runs/demo) [DEMO_OUT]"


def test_a_comma_separated_list_is_checked_item_by_item_and_keeps_its_order(capsys):
    """``listed``: "4,1,4" is [4, 1] (order kept, each once); a bad item, a bound broken or
    no item at all refuses the whole value with the list's words."""
    option = Option("counts", kind="int", listed=True, minimum=1, metavar="N,N,...")
    assert option.check("4, 1,4,") == [4, 1]
    assert Option("rates", kind="number", listed=True, above=0).check("0.5,2") == [0.5, 2.0]
    for text in ("1,x", "1,0", ",", ""):
        with pytest.raises(ValueError, match=rf"^'{text}': must be comma-separated integers >= 1$"):
            option.check(text)
    assert parse_error(option, ["--counts", "2,-1"], capsys) == (
        "p: error: argument --counts: invalid value '2,-1': must be comma-separated integers >= 1")
    with pytest.raises(ValueError, match="holds an int or a number"):
        Option("names", listed=True)


def test_a_repeated_flag_appends_to_a_fresh_list_each_parse():
    option = Option("done_from", [], repeat=True, metavar="JSONL")
    parser = argparse.ArgumentParser()
    add_to_command(parser, (option,))
    assert parser.parse_args(["--done-from", "a", "--done-from", "b"]).done_from == ["a", "b"]
    assert parser.parse_args([]).done_from == [] and option.default == []  # the declaration's list untouched


def test_an_operand_takes_the_rest_of_the_command_line():
    parser = argparse.ArgumentParser()
    add_to_command(parser, (Option("command", kind="choice", choices=("a", "b"), positional=True),
                            Option("args", nargs=argparse.REMAINDER, positional=True)))
    args = parser.parse_args(["a", "--x", "1", "y"])
    assert (args.command, args.args) == ("a", ["--x", "1", "y"])


def test_every_command_option_is_declared_as_an_option():
    """No command in resnmt/ or benchmarks/ adds an argument of its own: each goes through
    Option.add_to (its checks, its words), the one place an option meets a parser."""
    import ast

    root = Path(__file__).resolve().parent.parent
    raw = []
    for path in sorted([*root.glob("resnmt/**/*.py"), *root.glob("benchmarks/*.py")]):
        if path == root / "resnmt" / "options.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                raw.append(f"{path.relative_to(root)}:{node.lineno}")
    assert raw == []
