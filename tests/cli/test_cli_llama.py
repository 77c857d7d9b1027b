"""llama.cpp's command-line spellings (issue 25 item 8): each parses and does what llama.cpp's
does, or fails with a message that names it; a value never joins its flag (`-ngld 99` is not
`-n gld`, `-cnv` is not `-c nv`)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from moa_cpp.cli.main import build_parser, main


def _parse(*argv: str):
    p = build_parser("generate")
    return p.subcommand_parsers["generate"], p.parse_args(["generate", *argv])


@pytest.mark.parametrize("word", ["-ngld99", "-ngldx", "-cnvx", "-ctkq8_0", "-n5", "-fax", "-sysx", "-ctx"])
def test_glued_or_unknown_single_dash_words_are_named(word, capsys):
    """argparse alone read `-ngld 99` as `-n gld` and `-cnv` as `-c nv` (before -ngld / -cnv were
    known): any single-dash word that is not a flag is an error naming it, never split."""
    with pytest.raises(SystemExit) as e:
        main(["generate", word, "-p", "hi"])
    assert e.value.code == 2
    assert repr(word) in capsys.readouterr().err


def test_values_that_look_like_flags_stay_values():
    from moa_cpp.cli.llama_flags import refuse_glued_short_options
    sub, _ = _parse("-p", "x")
    refuse_glued_short_options(sub, ["-p", "- a list item", "--temp", "-0.5", "-p=-x", "--", "-weird"])


def test_llama_flags_parse_to_target_options():
    from moa_cpp.cli.llama_flags import drafter_device, target_options
    _, a = _parse("-p", "x", "-fa", "off", "-b", "256", "-ub", "128", "--mlock", "--no-mmap", "-ctk", "q8_0",
                  "-ctv", "q8_0", "--jinja", "--chat-template", "chatml", "-ngld", "0")
    assert target_options(a) == dict(n_batch=256, n_ubatch=128, use_mmap=False, use_mlock=True, cache_type="q8_0",
                                     flash_attn=False, chat_template="chatml")
    assert drafter_device(a) == "cpu"
    _, a = _parse("-p", "x", "-fa")                       # a bare -fa means on
    assert target_options(a)["flash_attn"] is True and target_options(a)["cache_type"] == "f16"
    _, a = _parse("-p", "x", "-ngld", "99")
    assert drafter_device(a) == "gpu"


@pytest.mark.parametrize("argv,needle", [
    (["-b", "32"], "-b/--batch-size 32"),
    (["-b", "128", "-ub", "256"], "-ub/--ubatch-size 256"),
    (["-ctk", "q8_0", "-ctv", "f16"], "-ctk q8_0 and -ctv f16"),
    (["--draft-p-min", "0.8"], "--draft-p-min"),
    (["--chat-template", "chatml", "--chat-template-file", "x.jinja"], "--chat-template-file"),
    (["--chat-template-file", "/no/such/template.jinja"], "/no/such/template.jinja"),
    (["-ngld", "0", "--device", "cpu"], "-ngld"),
    (["-f", "/no/such/prompt.txt"], "/no/such/prompt.txt"),
    (["--grammar", "root ::= ["], "could not parse"),
    (["--grammar", 'root ::= "a"', "-j", "{}"], "give one of --grammar"),
    (["-j", "{bad"], "-j/--json-schema: not valid JSON"),
    (["--grammar-file", "/no/such/g.gbnf"], "/no/such/g.gbnf"),
])
def test_refused_with_a_message_naming_the_flag(argv, needle, capsys):
    args = ["generate", "-p", "x", *argv] if "-f" not in argv else ["generate", *argv]
    assert main(args) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.model
def test_a_llama_cpp_command_line_runs_as_written(tmp_path):
    """-sys, -f, -fa, -b, -ub, --mlock, --no-mmap, -ctk/-ctv, --jinja, -no-cnv, -ngld together: the
    answer equals the Python API's for the same system + user messages (greedy)."""
    from moa_cpp import SpeculativeGenerator
    from moa_cpp.models import defaults
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Name two colors.")
    cmd = [sys.executable, "-m", "moa_cpp.cli.main", "generate", "-m", defaults.default_target(), "-sys", "Be brief.",
           "-f", str(prompt), "-n", "12", "-fa", "on", "-b", "512", "-ub", "512", "--mlock", "--no-mmap",
           "-ctk", "f16", "-ctv", "f16", "--jinja", "-no-cnv", "-ngld", "0", "-t", "1", "--json", "--no-draft"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    gen = SpeculativeGenerator.from_paths(defaults.default_target(), None, draft="none", n_threads=1)
    try:
        ref = gen.generate([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name two colors."}],
                           chat=True, max_tokens=12)
    finally:
        gen.close()
    assert out["tokens"] == ref.tokens and out["text"] == ref.text


@pytest.mark.model
def test_grammar_flags_constrain_the_output(tmp_path, capsys):
    """--grammar-file and -j/--json-schema (llama.cpp's spellings) give the Python API's
    constrained output."""
    from moa_cpp import SpeculativeGenerator
    from moa_cpp.models import defaults
    from moa_cpp.structured import grammar_for_json_schema
    gbnf = tmp_path / "yn.gbnf"
    gbnf.write_text('root ::= ("yes" | "no") "."\n')
    schema = '{"type": "object", "properties": {"color": {"type": "string"}}, "required": ["color"]}'
    gen = SpeculativeGenerator.from_paths(defaults.default_target(), None, draft="none", n_threads=1)
    try:
        for flags, grammar in ((["--grammar-file", str(gbnf)], gbnf.read_text()),
                               (["-j", schema], grammar_for_json_schema(schema))):
            assert main(["generate", "-p", "Is grass green?", "-n", "16", "-t", "1", "--json", *flags]) == 0
            out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
            ref = gen.generate("Is grass green?", max_tokens=16, grammar=grammar)
            assert out["text"] == ref.text and out["tokens"] == ref.tokens
            assert ref.text in ("yes.", "no.") or json.loads(ref.text)["color"]
    finally:
        gen.close()
