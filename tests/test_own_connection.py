"""A connection kind of one's own, from outside the package: the example's LayerScale
(examples/layerscale, installed: it registers through its entry point) and a kind in a
single file (``--connections FILE``) train through fairseq-train, decode through
fairseq-generate and the hub, and their checkpoint names the modules they come from; a
checkpoint whose module is gone, and a kind named as a built-in one, are one line each."""
import re
import sys
import textwrap

import pytest
import torch

from conftest import REPO_ROOT, run_cli
from model_utils import TINY

USER_DIR = str(REPO_ROOT / "resnmt")
HALF_POST_LN = textwrap.dedent('''
    """LN(x + F/2): a kind in a file of its own."""
    from resnmt.connections import SublayerConnection, register_connection


    @register_connection
    class HalfPostLN(SublayerConnection):
        kind, equation, source = "half_post_ln", "LN(x + F/2)", "a test"

        def __init__(self, dim, spec):
            super().__init__()
            self.norm = spec.norm(dim)

        def forward(self, x, fx):
            return self.norm(x + 0.5 * fx)
''')


def test_kinds_from_a_package_and_a_file_train_decode_and_load(tiny_bin, tmp_path, capsys):
    kind_file = tmp_path / "half_post_ln.py"
    kind_file.write_text(HALF_POST_LN)
    save = tmp_path / "run"
    run_cli(["fairseq-train", tiny_bin, "--user-dir", USER_DIR, "--arch", "resnmt_transformer", *TINY,
             "--connections", kind_file, "--encoder-residual", "layerscale", "--decoder-residual", "half_post_ln",
             "--layer-scale-init", "0.01", "--optimizer", "adam", "--lr", "5e-4", "--max-tokens", "800",
             "--max-update", "3", "--save-dir", save, "--no-epoch-checkpoints", "--seed", "1", "--num-workers", "0"])
    checkpoint = save / "checkpoint_last.pt"
    args = torch.load(checkpoint, weights_only=True)["cfg"]["model"]
    assert args.connections == f"resnmt_layerscale.connection,{kind_file}"  # what loading it needs
    out = run_cli(["fairseq-generate", tiny_bin, "--user-dir", USER_DIR, "--path", checkpoint, "--gen-subset", "valid",
                   "--beam", "2", "--batch-size", "32", "--required-batch-size-multiple", "1"])
    assert len([line for line in out.stdout.splitlines() if line.startswith("H-")]) == 60

    import resnmt
    from resnmt.connections import CONNECTION_CLASSES

    hub = resnmt.from_pretrained(save, checkpoint_file="checkpoint_last.pt", data_name_or_path=str(tiny_bin))
    assert isinstance(hub.translate("a man is walking .", beam=2), str)
    encoder, decoder = hub.models[0].encoder, hub.models[0].decoder
    assert type(encoder.layers[0].ffn_connection).__name__ == "LayerScaleConnection"
    assert type(decoder.layers[0].ffn_connection) is CONNECTION_CLASSES["half_post_ln"]  # imported from the file

    assert_loading_stops_in_one_line(checkpoint, tmp_path / "moved.pt", tiny_bin, capsys, kind_file)


def assert_loading_stops_in_one_line(checkpoint, moved, data, capsys, kind_file):
    """Loading a checkpoint whose kind no module registers, or whose recorded module is gone:
    from Python (the hub, fairseq's loading) an exception whose message is one line naming the
    kind and the module, and fairseq-generate ends with that line."""
    import resnmt
    from fairseq import checkpoint_utils

    from resnmt.connections import ConnectionConfigError

    state = torch.load(checkpoint, weights_only=True)
    state["cfg"]["model"].decoder_residual = "gone_kind"  # a kind no module registers
    elsewhere = moved.parent / "elsewhere.py"
    for connections, expected in (
        (state["cfg"]["model"].connections, "--residual gone_kind is not a connection kind: neither built in (post_ln, "
         f"pre_ln, "),
        (str(elsewhere), f"--residual gone_kind needs connection module {elsewhere}, which cannot be imported ("),
    ):
        state["cfg"]["model"].connections = connections
        torch.save(state, moved)
        with pytest.raises(ConnectionConfigError) as stop:
            checkpoint_utils.load_model_ensemble_and_task([str(moved)], arg_overrides={"data": str(data)})
        last = str(stop.value)
        assert "\n" not in last and expected in last and "pip install the package" in last, last
        if connections != str(elsewhere):
            assert f"nor registered by the modules loaded (resnmt_layerscale.connection, {kind_file})" in last, last
    with pytest.raises(ConnectionConfigError, match="^" + re.escape(last) + "$"):  # a notebook's: not SystemExit
        resnmt.from_pretrained(moved.parent, checkpoint_file=moved.name, data_name_or_path=str(data))
    proc = run_cli(["fairseq-generate", data, "--user-dir", USER_DIR, "--path", moved, "--gen-subset", "valid",
                    "--beam", "2", "--batch-size", "32"], check=False)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == f"fairseq-generate: error: {last}"


def test_help_lists_the_kinds_and_flags_of_a_package_and_of_a_file_loaded_later(tmp_path):
    """--residual's choices and help, and the kinds' flags, are those registered when fairseq
    adds the model's flags (resnmt-train --help), a file imported after resnmt included."""
    from fairseq import options

    from resnmt.connections import import_connections
    from resnmt.models import ResidualTransformerModel

    kind_file = tmp_path / "half_post_ln.py"
    kind_file.write_text(HALF_POST_LN.replace('"half_post_ln"', '"half_post_ln_help"'))
    import_connections(str(kind_file))
    parser = options.get_training_parser()
    ResidualTransformerModel.add_args(parser.add_argument_group("model"))
    text = " ".join(parser.format_help().split())  # argparse's wrapping undone
    assert "layerscale: x + diag(λ)·F(LN(x))" in text and "--layer-scale-init EPS" in text
    assert "half_post_ln_help: LN(x + F/2) [a test]" in text
    residual = next(a for a in parser._actions if "--residual" in a.option_strings)
    assert {"post_ln", "layerscale", "half_post_ln_help"} <= set(residual.choices)


def test_a_kind_named_as_a_built_in_one_is_refused_in_one_line(tmp_path, tiny_bin):
    clash = tmp_path / "clash.py"
    clash.write_text(HALF_POST_LN.replace('"half_post_ln"', '"post_ln"'))
    proc = run_cli(["resnmt-train", tiny_bin, "--arch", "resnmt_transformer", "--connections", clash,
                    "--residual", "post_ln", "--max-tokens", "800"], check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"resnmt-train: error: --residual post_ln: connection kind 'post_ln' of module {clash} clashes with the built-in kind post_ln: "
        "give it another name")


def test_a_module_that_cannot_be_imported_stops_a_command_in_one_line(tmp_path, tiny_bin, capsys):
    """RESNMT_CONNECTIONS (or --connections) naming a missing file: the exception in Python,
    one line and exit status 2 when fairseq parses a command line."""
    from fairseq import options

    from resnmt.connections import ConnectionConfigError
    from resnmt.connections.plugins import load_user_kinds

    missing = tmp_path / "missing.py"
    message = f"connection module '{missing}' cannot be imported: FileNotFoundError: no such file {missing}"
    with pytest.raises(ConnectionConfigError, match="^" + re.escape(message) + "$"):
        load_user_kinds(environ={"RESNMT_CONNECTIONS": str(missing)})
    with pytest.raises(ConnectionConfigError, match="^" + re.escape(message) + "$"):
        load_user_kinds(str(missing), environ={})
    parser = options.get_training_parser()
    parser.prog = "resnmt-train"
    with pytest.raises(SystemExit) as stop:
        options.parse_args_and_arch(parser, [str(tiny_bin), "--arch", "resnmt_transformer", "--connections",
                                             str(missing)])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"resnmt-train: error: {message}"]


def test_importing_reads_neither_the_command_line_nor_the_environment(tmp_path):
    """``import resnmt.connections`` with --connections and RESNMT_CONNECTIONS naming missing
    files raises nothing; the kinds a file registers come back from load_user_kinds."""
    kind_file = tmp_path / "half_post_ln.py"
    kind_file.write_text(HALF_POST_LN.replace('"half_post_ln"', '"half_post_ln_import"'))
    code = ("import os, sys; sys.argv = ['x', '--connections', 'missing.py']; os.environ['RESNMT_CONNECTIONS'] = "
            "'gone.py'\nimport resnmt, resnmt.connections\nfrom resnmt.connections import CONNECTION_CLASSES, "
            f"load_user_kinds\nassert 'half_post_ln_import' not in CONNECTION_CLASSES\n"
            f"print(load_user_kinds({str(kind_file)!r}, environ={{}}))")
    proc = run_cli([sys.executable, "-c", code], check=False)
    assert proc.returncode == 0 and proc.stdout.split() == ["('half_post_ln_import',)"], proc.stderr


def test_an_installed_kind_that_fails_to_load_leaves_the_others_and_is_named_when_asked_for(monkeypatch, caplog):
    from importlib import metadata

    from resnmt.connections import ConnectionConfigError, plugins

    broken = metadata.EntryPoint("broken_kind", "no_such_module_of_a_kind", plugins.ENTRY_POINT_GROUP)
    monkeypatch.setattr(plugins.metadata, "entry_points", lambda group: [broken])
    monkeypatch.setattr(plugins, "BROKEN", {})
    plugins.load_entry_points()  # no exception: the built-in kinds and the other packages' work
    assert "entry point broken_kind = no_such_module_of_a_kind (package ?) failed to load: ModuleNotFoundError" \
        in caplog.text
    with pytest.raises(ConnectionConfigError, match=r"^--residual broken_kind is not a connection kind: .*\(entry "
                       r"point broken_kind = no_such_module_of_a_kind \(package \?\) failed to load: Module"):
        plugins.require_kinds(["broken_kind"], None)


def test_the_look_up_of_a_kind_not_registered_imports_resnmt_connections_first(tmp_path, monkeypatch):
    """From Python: a kind named by RESNMT_CONNECTIONS is found when first asked for (its
    module imported then), and a name no module registers is one ConnectionConfigError line."""
    from resnmt.connections import CONNECTION_CLASSES, ConnectionConfigError, ConnectionSpec

    kind_file = tmp_path / "looked_up.py"
    kind_file.write_text(HALF_POST_LN.replace('"half_post_ln"', '"half_post_ln_looked_up"'))
    monkeypatch.setenv("RESNMT_CONNECTIONS", str(kind_file))
    assert "half_post_ln_looked_up" not in CONNECTION_CLASSES
    assert ConnectionSpec("half_post_ln_looked_up").kind == "half_post_ln_looked_up"
    with pytest.raises(ConnectionConfigError, match=r"^--residual 'no_such_kind' is not a connection kind; choose one "
                       r"of post_ln, .*half_post_ln_looked_up$"):
        ConnectionSpec("no_such_kind")
