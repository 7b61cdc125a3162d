# SPDX-License-Identifier: BSD-3-Clause
"""``examples/generate.py`` end to end on the CPU: tiny random Llama models quantized, saved by
``fp4_ops.save_quantized`` in both formats with a word-level tokenizer, then loaded and run by
the script (every activation mode, a batch, both baselines); bad arguments exit 2 with a
sentence and no traceback."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import fp4_ops

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install -e .[hf])"
)
tokenizers = pytest.importorskip("tokenizers", reason="tokenizers is not installed")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "generate.py"
VOCAB = 128
PROMPT = "w3 w5 w7 w11"


def _script():
    spec = importlib.util.spec_from_file_location("generate_example", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generate = _script()


def _tokenizer():
    vocab = {f"w{i}": i for i in range(VOCAB - 1)} | {"[UNK]": VOCAB - 1}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    backend.decoder = tokenizers.decoders.WordPiece()  # (joins the words with spaces)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", pad_token="[UNK]"
    )


def _bf16_model() -> nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        initializer_range=0.2,
        bos_token_id=None,
        eos_token_id=VOCAB - 1,
        pad_token_id=VOCAB - 1,
        dtype="bfloat16",
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def _checkpoint(folder: Path, fmt: str, stored: str, dtype=torch.bfloat16) -> Path:
    """A tiny checkpoint: ``stored`` "bf16" (weight-only) or "static" (W4A4, input scale 0.01),
    its other modules in ``dtype``."""
    model = _bf16_model().to(dtype)
    if stored == "bf16":
        fp4_ops.quantize_model(model, ["model.layers.*"], activations="bf16")
    else:
        for name, m in list(model.named_modules()):
            if isinstance(m, nn.Linear) and name.startswith("model.layers."):
                parent, _, attr = name.rpartition(".")
                layer = fp4_ops.FP4Linear.from_linear(m, "nvfp4", "static", 0.01)
                setattr(model.get_submodule(parent), attr, layer)
    fp4_ops.save_quantized(model, folder, fmt, tokenizer=_tokenizer())
    return folder


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("generate")
    made = {}
    for fmt in ("compressed-tensors", "modelopt"):
        for stored in ("bf16", "static"):
            made[fmt, stored] = _checkpoint(root / f"{fmt}-{stored}", fmt, stored)
    source = root / "bf16-source"
    _bf16_model().save_pretrained(source)
    _tokenizer().save_pretrained(source)
    made["source"] = source
    return made


@pytest.fixture(scope="module")
def moe_checkpoint(tmp_path_factory):
    """A tiny Qwen3-MoE model, its experts quantized (W4A16) and saved as per-expert Linears."""
    config = transformers.Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        initializer_range=0.2,
        bos_token_id=None,
        eos_token_id=VOCAB - 1,
        pad_token_id=VOCAB - 1,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).eval()
    fp4_ops.quantize_model(model, ["*.mlp.experts"], activations="bf16")
    folder = tmp_path_factory.mktemp("generate-moe")
    fp4_ops.save_quantized(model, folder, tokenizer=_tokenizer())
    return folder


@pytest.mark.fused_experts
def test_moe_checkpoint_generates_with_a_dequantized_baseline(moe_checkpoint, capsys):
    """An MoE checkpoint: its experts load as FP4Experts and say so; the dequantized baseline
    replaces them too (its label counts them) and computes what they compute, up to the two
    paths' BF16 roundings (2^-5 relative on the logits; a misread expert is off by order one)."""
    argv = ["--model", str(moe_checkpoint), "--max_new_tokens", "4", "--baseline"]
    code, out, err = _run(argv + ["--prompt", PROMPT], capsys)
    assert code == 0, err
    assert f"{moe_checkpoint} on CPU: W4A16; greedy" in out
    assert "--- BF16 (the FP4 model dequantized, 2 layers)" in out
    model = fp4_ops.load_quantized(moe_checkpoint)
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        fp4 = model(ids).logits.double()
        assert generate.dequantize_in_place(model) == 2
        assert not any(isinstance(m, fp4_ops.FP4Experts) for m in model.modules())
        bf16 = model(ids).logits.double()
    assert float((fp4 - bf16).norm() / bf16.norm()) <= 2.0**-5


def _run(argv, capsys) -> tuple[int, str, str]:
    """The command line's CPU path, on any machine: "--device cpu" unless a device is given
    (its default is the GPU where there is one)."""
    argv = argv if "--device" in argv else [*argv, "--device", "cpu"]
    code = generate.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


# ----------------------------------------------------------------------------- it generates


@pytest.mark.parametrize(
    "fmt, stored, flag, modes",
    [
        ("compressed-tensors", "bf16", None, "W4A16"),
        ("compressed-tensors", "bf16", "fp4", "W4A4 dynamic"),
        ("compressed-tensors", "static", None, "W4A4 static"),
        ("compressed-tensors", "static", "bf16", "W4A16"),
        ("modelopt", "bf16", "fp4", "W4A4 dynamic"),
        ("modelopt", "static", "fp4", "W4A4 static"),
    ],
)
def test_generates_and_times_decode(fmt, stored, flag, modes, checkpoints, capsys):
    folder = checkpoints[fmt, stored]
    argv = ["--model", str(folder), "--max_new_tokens", "5", "--batch", "3", "--prompt", PROMPT]
    argv += ["--activations", flag] if flag else []
    code, out, err = _run(argv, capsys)
    assert code == 0, err
    assert f"on CPU: {modes}; greedy, dynamic cache, eager" in out
    assert f"--- FP4 ({modes})" in out
    rows = re.findall(r"^\[(\d)\] '(.*)'$", out, re.MULTILINE)
    assert [i for i, _ in rows] == ["0", "1", "2"]
    # (the same prompt in every row: the same greedy words, from the tokenizer's vocabulary)
    assert len({text for _, text in rows}) == 1
    assert re.fullmatch(r"(w\d+ ?){5}", rows[0][1]), rows[0][1]
    decode = re.search(r"decode: 4 steps x batch 3 in ([\d.]+) s = ([\d.]+) tokens/s", out)
    assert decode and float(decode[2]) > 0, out
    assert "prefill (prompt -> first token):" in out and "BF16" not in out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the default device is a GPU's only")
def test_runs_on_the_gpu_by_default_with_the_cpu_tokens(checkpoints, capsys):
    folder = checkpoints["compressed-tensors", "static"]
    argv = ["--model", str(folder), "--max_new_tokens", "6"]
    assert generate.main(argv) == 0
    out = capsys.readouterr().out
    assert f"on {torch.cuda.get_device_name()}: W4A4 static; greedy, dynamic cache, eager" in out
    code, cpu_out, _ = _run(argv, capsys)
    assert code == 0
    rows = [re.findall(r"^\[0\] '.*'$", text, re.MULTILINE) for text in (out, cpu_out)]
    assert rows[0] == rows[1] and len(rows[0]) == 1, rows


def test_tokens_are_the_models_greedy_tokens(checkpoints, capsys):
    folder = checkpoints["compressed-tensors", "static"]
    code, out, _ = _run(["--model", str(folder), "--max_new_tokens", "6"], capsys)
    assert code == 0
    model = fp4_ops.load_quantized(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tokenizer(generate.DEFAULT_PROMPT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        for _ in range(6):
            ids = torch.cat([ids, model(ids).logits[:, -1:].argmax(-1)], 1)
    words = tokenizer.decode(ids[0, -6:], skip_special_tokens=True)
    assert f"[0] {words!r}" in out


#: a chat template in the test vocabulary: w1 opens a user turn, w2 closes it, w9 opens the reply
CHAT_TEMPLATE = (
    "{% for m in messages %}w1 {{ m['content'] }} w2 {% endfor %}"
    "{% if add_generation_prompt %}w9{% endif %}"
)


def test_chat_prompts_are_user_messages_in_the_chat_template(checkpoints, capsys, tmp_path):
    """--chat: each prompt goes through the tokenizer's chat template as a user message with
    the assistant's turn opened, and the tokens generated are the model's greedy ones after
    exactly those ids; a tokenizer without a template exits 2 naming --chat."""
    folder = tmp_path / "chat"
    shutil.copytree(checkpoints["compressed-tensors", "bf16"], folder)
    tokenizer = _tokenizer()
    # (a tokenizer that adds a BOS, w0, to plain text: the template's text must not get one)
    bos = tokenizers.processors.TemplateProcessing(single="w0 $A", special_tokens=[("w0", 0)])
    tokenizer.backend_tokenizer.post_processor = bos
    assert tokenizer(PROMPT)["input_ids"][0] == 0
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    inputs = generate.encode(generate.load_tokenizer(str(folder)), [PROMPT], 2, "cpu", chat=True)
    want = torch.tensor([[1, 3, 5, 7, 11, 2, 9]] * 2)  # (w1 w3 w5 w7 w11 w2 w9)
    assert torch.equal(inputs["input_ids"], want)
    argv = ["--model", str(folder), "--chat", "--prompt", PROMPT, "--max_new_tokens", "4"]
    code, out, err = _run(argv, capsys)
    assert code == 0, err
    model = fp4_ops.load_quantized(folder)
    ids = want[:1]
    with torch.no_grad():
        for _ in range(4):
            ids = torch.cat([ids, model(ids).logits[:, -1:].argmax(-1)], 1)
    assert f"[0] {tokenizer.decode(ids[0, 7:], skip_special_tokens=True)!r}" in out
    argv = ["--model", str(checkpoints["modelopt", "bf16"]), "--chat"]
    code, _, err = _run(argv, capsys)
    assert (
        code == 2
        and err == "error: --chat: the tokenizer has no chat template (leave out --chat)\n"
    )


@pytest.mark.parametrize("source", [False, True], ids=["dequantized", "baseline_model"])
def test_baseline(source, checkpoints, capsys):
    argv = ["--model", str(checkpoints["modelopt", "bf16"]), "--max_new_tokens", "4", "--baseline"]
    if source:
        argv += ["--baseline_model", str(checkpoints["source"])]
    code, out, err = _run(argv, capsys)
    assert code == 0, err
    label = f"BF16 ({checkpoints['source']})" if source else "BF16 (the FP4 model dequantized, 14"
    assert f"--- {label}" in out
    assert len(re.findall(r"decode: 3 steps x batch 1 in .* tokens/s", out)) == 2
    assert re.search(r"FP4 / BF16 decode tokens per second: [\d.]+x", out)
    assert re.search(r"greedy tokens equal to BF16's at [\d.]+% of positions", out)


#: a baseline that cannot stand for the checkpoint -> (its config.json's edit, the error)
BROKEN_BASELINES = {
    "more layers": ({"num_hidden_layers": 3}, "another architecture (num_hidden_layers 3, "),
    "another width": ({"intermediate_size": 96}, "another architecture (intermediate_size 96, "),
    "fewer kv heads": ({"num_key_value_heads": 1}, "another architecture (num_key_value_heads"),
    "no weights": ({}, "no file named"),
}


@pytest.mark.parametrize("broken", BROKEN_BASELINES)
def test_an_unusable_baseline_model_exits_2(broken, checkpoints, capsys, tmp_path):
    """A baseline of another architecture is refused before anything runs; one whose weights do
    not load, once it is loaded: exit 2 and one line naming it, no traceback."""
    edit, message = BROKEN_BASELINES[broken]
    config = json.loads((checkpoints["source"] / "config.json").read_text()) | edit
    (tmp_path / "config.json").write_text(json.dumps(config))
    argv = ["--model", str(checkpoints["modelopt", "bf16"]), "--max_new_tokens", "3"]
    code, out, err = _run([*argv, "--baseline", "--baseline_model", str(tmp_path)], capsys)
    assert code == 2 and err.startswith(f"error: --baseline_model {tmp_path}: "), err
    assert message in err and err.count("\n") == 1
    assert ("--- FP4" in out) == (broken == "no weights")


@pytest.mark.parametrize("fmt", ["compressed-tensors", "modelopt"])
def test_a_quantized_baseline_model_exits_2(fmt, checkpoints, capsys):
    """An FP4 checkpoint is no BF16 baseline: refused before anything runs."""
    folder = checkpoints[fmt, "bf16"]
    argv = ["--model", str(checkpoints["compressed-tensors", "static"]), "--max_new_tokens", "3"]
    code, out, err = _run([*argv, "--baseline", "--baseline_model", str(folder)], capsys)
    assert code == 2 and "--- FP4" not in out
    assert err == f"error: --baseline_model {folder}: a quantized checkpoint, not a BF16 model\n"


@pytest.mark.parametrize("failing", [1, 2], ids=["fp4", "baseline"])
def test_running_out_of_memory_exits_2_naming_the_sizes(failing, checkpoints, capsys, monkeypatch):
    """A generate that runs out of device memory (the FP4 model's, or the baseline's) ends the
    run with one error line naming --batch and --max_new_tokens, exit 2, no traceback."""
    calls = []
    real = generate.generate_timed

    def generate_timed(*args, **kwargs):
        calls.append(1)
        if len(calls) == failing:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9 GiB")
        return real(*args, **kwargs)

    monkeypatch.setattr(generate, "generate_timed", generate_timed)
    argv = ["--model", str(checkpoints["compressed-tensors", "bf16"]), "--max_new_tokens", "3"]
    code, out, err = _run([*argv, "--batch", "2", "--baseline"], capsys)
    assert code == 2 and len(calls) == failing
    assert err == "error: out of cpu memory for --batch 2 x --max_new_tokens 3: give fewer\n"
    assert ("--- FP4" in out) == (failing == 2)


def test_each_prompt_is_a_row(checkpoints, capsys):
    """Without --batch, one row per --prompt, each its own: prompts of different lengths in one
    batch continue as each does alone (padding, masks and positions as generate needs them);
    a --batch with fewer rows than prompts is refused."""
    prompts = ["w3 w4 w5", "w6", "w7 w8"]
    argv = ["--model", str(checkpoints["compressed-tensors", "bf16"]), "--max_new_tokens", "3"]
    alone = []
    for prompt in prompts:
        code, out, err = _run([*argv, "--prompt", prompt], capsys)
        assert code == 0, err
        alone += re.findall(r"^\[0\] (.*)$", out, re.MULTILINE)
    argv += [a for p in prompts for a in ("--prompt", p)]
    code, out, err = _run(argv, capsys)
    assert code == 0, err
    assert re.findall(r"^\[(\d)\] ", out, re.MULTILINE) == ["0", "1", "2"]
    assert re.findall(r"^\[\d\] (.*)$", out, re.MULTILINE) == alone
    assert "decode: 2 steps x batch 3 in" in out
    with pytest.raises(SystemExit) as exc:
        generate.parse_args([*argv, "--batch", "2"])
    assert exc.value.code == 2
    assert "--batch 2 leaves out prompts: 3 are given" in capsys.readouterr().err


def test_printed_timings_and_rates_are_what_the_clock_saw(checkpoints, capsys, monkeypatch):
    """With a clock that the test sets (the FP4 run: the first token 1 s after the prompt, then
    one every 0.5 s; the baseline: 2 s, then 1 s), every printed figure follows from it and the
    printed steps and batch: prefill from the prompt to the first token, decode from the first
    token to the last, tokens per second = batch x (steps - 1) / decode time, and the FP4 / BF16
    ratio of the two runs' rates."""
    clocks = []

    def put(clock, value):
        if not clock.times:
            clocks.append(clock)
        prefill, step = ((1.0, 0.5), (2.0, 1.0))[clocks.index(clock)]
        n = len(clock.times)
        clock.times.append(0.0 if n == 0 else prefill + (n - 1) * step)

    monkeypatch.setattr(generate.StepClock, "put", put)
    folder = checkpoints["compressed-tensors", "bf16"]
    argv = ["--model", str(folder), "--max_new_tokens", "5", "--batch", "3", "--baseline"]
    code, out, err = _run([*argv, "--prompt", PROMPT], capsys)
    assert code == 0, err
    decodes = re.findall(
        r"^decode: (\d+) steps x batch 3 in ([\d.]+) s = ([\d.]+) tokens/s "
        r"\(([\d.]+) ms/step\)$",
        out,
        re.MULTILINE,
    )
    prefills = re.findall(r"^prefill \(prompt -> first token\): ([\d.]+) ms", out, re.MULTILINE)
    assert len(decodes) == len(prefills) == len(clocks) == 2, out
    for (steps, seconds, rate, per_step), prefill, (first, step) in zip(
        decodes, prefills, ((1.0, 0.5), (2.0, 1.0)), strict=True
    ):
        assert float(prefill) == 1e3 * first
        assert float(seconds) == pytest.approx(int(steps) * step)
        assert float(rate) == pytest.approx(3 / step, abs=0.05)
        assert float(per_step) == pytest.approx(1e3 * step)
    assert "FP4 / BF16 decode tokens per second: 2.00x" in out


@pytest.mark.parametrize(
    ("steps", "max_new", "decode", "stopped"),
    [
        (2, 2, "decode: 1 step x batch 2 in", None),
        (3, 3, "decode: 2 steps x batch 2 in", None),
        (2, 5, "decode: 1 step x batch 2 in", "; every row ended after 2 steps"),
        (1, 5, "decode: not measured", "; every row ended after 1 step\n"),
    ],
)
def test_report_counts_steps_in_words(steps, max_new, decode, stopped, capsys):
    """The report says "1 step", "2 steps", and says when the rows ended early."""

    class Tokenizer:
        def decode(self, row, skip_special_tokens):
            return "text"

    result = {"tokens": [[1], [2]], "steps": steps, "prefill_s": 0.1, "decode_s": 0.2}
    result["decode_tok_s"] = 2 * (steps - 1) / 0.2
    generate.report("FP4", Tokenizer(), result, 2, max_new)
    out = capsys.readouterr().out
    assert decode in out
    assert (stopped is None) == ("ended after" not in out)
    assert stopped is None or stopped in out
    assert re.search(r"\b1 steps\b", out) is None


@pytest.mark.parametrize(("n", "words"), [(0, "0 layers"), (1, "1 layer"), (14, "14 layers")])
def test_counted_is_plural_unless_one(n, words):
    assert generate.counted(n, "layer") == words


def test_dequantized_baseline_of_a_float32_checkpoint_is_a_bf16_model(tmp_path, capsys):
    """A W4A4 checkpoint whose other modules are float32 (loaded in the config's dtype): its
    dequantized baseline is a BF16 model throughout, as its label says, not float32 modules
    feeding BF16 layers."""
    folder = _checkpoint(tmp_path / "fp32", "modelopt", "static", torch.float32)
    assert fp4_ops.load_quantized(folder).get_input_embeddings().weight.dtype == torch.float32
    argv = ["--model", str(folder), "--max_new_tokens", "3", "--baseline", "--prompt", PROMPT]
    code, out, err = _run(argv, capsys)
    assert code == 0, err
    assert "--- BF16 (the FP4 model dequantized, 14 layers)" in out


def test_dequantized_baseline_computes_the_fp4_weights(checkpoints):
    model = fp4_ops.load_quantized(checkpoints["compressed-tensors", "bf16"])
    weights = {
        n: m.weight.dequantize(torch.bfloat16)
        for n, m in model.named_modules()
        if isinstance(m, fp4_ops.FP4Linear)
    }
    ids = torch.tensor([[3, 5, 7, 11]])
    with torch.no_grad():
        w4a16 = model(ids).logits
    assert generate.dequantize_in_place(model) == len(weights) == 14
    for name, weight in weights.items():
        linear = model.get_submodule(name)
        assert type(linear) is nn.Linear and torch.equal(linear.weight, weight)
    with torch.no_grad():
        bf16 = model(ids).logits
    # (W4A16 on the CPU multiplies by the fp32 weights; these are them rounded to BF16, 2^-9)
    assert float((bf16.float() - w4a16.float()).norm() / w4a16.float().norm()) < 0.02


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--batch", "0"], "--batch must be at least 1"),
        (["--max_new_tokens", "1"], "--max_new_tokens must be at least 2"),
        (["--activations", "fp8"], "invalid choice: 'fp8'"),
        (["--baseline_model", "{source}"], "give --baseline too"),
        (["--device", "meta"], "--device 'meta': cuda or cpu"),
        (["--device", "nonsense"], "not a device"),
        (["--device", "cpu:5"], "the CPU has no index but 0"),
        (["--compile"], "--compile captures CUDA graphs: it needs --device cuda"),
        (["--tokenizer", "{missing}"], "no tokenizer.json / tokenizer_config.json"),
    ],
)
def test_bad_arguments_exit_2(argv, message, checkpoints, capsys, tmp_path):
    if "--device" not in argv and "--compile" in argv and torch.cuda.is_available():
        argv = [*argv, "--device", "cpu"]
    fills = {"source": str(checkpoints["source"]), "missing": str(tmp_path / "nowhere")}
    argv = ["--model", str(checkpoints["modelopt", "bf16"])] + [a.format(**fills) for a in argv]
    with pytest.raises(SystemExit) as exc:
        generate.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3_moe"])
def test_a_folder_without_tokenizer_files_has_no_tokenizer(model_type, tmp_path):
    """A config.json alone is no tokenizer (transformers 5 may build an empty one from it,
    whose prompts encode to nothing): ValueError asking for --tokenizer."""
    config = transformers.AutoConfig.for_model(model_type)
    config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"no tokenizer that loads .*pass --tokenizer DIR"):
        generate.load_tokenizer(str(tmp_path))


def test_a_hub_repository_generates_and_a_missing_one_exits_2(checkpoints, capsys, monkeypatch):
    """``--model org/name``: the files fetched (here from a stand-in for the Hub's cache), the
    tokenizer from them; a repository the Hub refuses, or a path that is neither: exit 2."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    from huggingface_hub.errors import LocalEntryNotFoundError

    def snapshot_download(repo_id, revision=None, allow_patterns=None, **kwargs):
        if repo_id == "org/gated":  # (online refusals are OSErrors, not FileNotFoundErrors)
            raise OSError(f"403 Client Error: access to {repo_id} is restricted")
        if repo_id != "org/fp4":
            raise LocalEntryNotFoundError(f"{repo_id}: not in the cache, and offline")
        return str(checkpoints["compressed-tensors", "bf16"])

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    code, out, err = _run(["--model", "org/fp4", "--max_new_tokens", "3"], capsys)
    assert code == 0, err
    assert "org/fp4 on CPU: W4A16" in out and re.search(r"^\[0\] '(w\d+ ?){3}'$", out, re.M)
    code, _, err = _run(["--model", "org/absent"], capsys)
    assert code == 2 and err == "error: --model: org/absent: not in the cache, and offline\n", err
    code, _, err = _run(["--model", "org/gated"], capsys)
    assert code == 2
    assert err == "error: --model: 403 Client Error: access to org/gated is restricted\n", err
    with pytest.raises(SystemExit) as exc:
        generate.parse_args(["--model", "a/b/c"])
    assert exc.value.code == 2
    assert (
        "a/b/c: not a model folder (no config.json) nor a Hub repository" in capsys.readouterr().err
    )
    # (a folder that exists is a folder, whatever its name looks like)
    monkeypatch.chdir(checkpoints["source"].parent)
    (checkpoints["source"].parent / "org" / "empty").mkdir(parents=True, exist_ok=True)
    with pytest.raises(SystemExit):
        generate.parse_args(["--model", "org/empty"])
    assert "org/empty: not a model folder (no config.json)" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a CPU-only machine")
def test_cuda_without_a_gpu_exits_2(checkpoints, capsys):
    with pytest.raises(SystemExit) as exc:
        generate.parse_args(["--model", str(checkpoints["modelopt", "bf16"]), "--device", "cuda"])
    assert exc.value.code == 2
    assert "torch sees no CUDA GPU" in capsys.readouterr().err


def test_unusable_folders_exit_2(checkpoints, capsys, tmp_path):
    # a 16-bit model is no FP4 checkpoint; a checkpoint without tokenizer files needs --tokenizer
    code, _, err = _run(["--model", str(checkpoints["source"])], capsys)
    assert code == 2 and err.startswith(f"error: {checkpoints['source']}: not a quantized"), err
    bare = tmp_path / "bare"
    model = _bf16_model()
    fp4_ops.quantize_model(model, ["model.layers.*"], activations="bf16")
    fp4_ops.save_quantized(model, bare)
    code, _, err = _run(["--model", str(bare), "--device", "cpu"], capsys)
    assert code == 2 and "no tokenizer that loads" in err and "--tokenizer DIR" in err, err
    # (a folder of tokenizer files alone, without the model's config.json, will do)
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    for f in Path(checkpoints["source"]).iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, tokenizer)
    assert not (tokenizer / "config.json").exists() and any(tokenizer.iterdir())
    code, out, err = _run(
        ["--model", str(bare), "--tokenizer", str(tokenizer), "--device", "cpu"], capsys
    )
    assert code == 0, err
    # a config.json whose sizes transformers cannot build a model from
    broken = tmp_path / "broken"
    shutil.copytree(checkpoints["modelopt", "static"], broken)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "hidden_size": -8}))
    code, _, err = _run(["--model", str(broken), "--device", "cpu"], capsys)
    assert code == 2 and "config.json: transformers cannot build the model" in err, err


def test_command_line(checkpoints):
    """As a user runs it: the file itself, from another folder; a bad argument: exit 2 and one
    line, no traceback."""
    folder = str(checkpoints["modelopt", "static"])
    run = [
        sys.executable,
        str(SCRIPT),
        "--model",
        folder,
        "--max_new_tokens",
        "3",
        "--device",
        "cpu",
    ]
    done = subprocess.run(run, capture_output=True, text=True, cwd=checkpoints["source"].parent)
    assert done.returncode == 0, done.stderr
    assert "decode: 2 steps x batch 1" in done.stdout
    done = subprocess.run([*run, "--batch", "-1"], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--batch must be at least 1, got -1" in done.stderr
