"""What `rrfp run` refuses before any rank starts, in this process ([Note: the two CLI runners]): bad flags and
config files, shapes and hints that cannot run, a socket address this host cannot listen on, --out that holds
files, --p2p blocking where it cannot work, bad --resume / --checkpoint-every / --workload factories. Each is one
`error:` line and exit 2, and nothing is written. And what it does accept there: an empty --out, claimed and
handed to the launch. Runs that start ranks: tests/multiproc/test_run.py.
"""

from __future__ import annotations

import time

import pytest

from tests.helpers.cli import one_error_line, run_cli


def test_config_file_lookahead_and_bad_value(tmp_path):
    from runtime.config import build_config, load_toml

    (tmp_path / "la.toml").write_text('lookahead = "off"\nhint = "zb"\n')
    config = build_config(load_toml(tmp_path / "la.toml"), {})
    assert config.lookahead is False and config.rule().name == "greedy"
    (tmp_path / "bad.toml").write_text('lookahead = "sometimes"\n')
    line = one_error_line(run_cli(tmp_path, "run", "--config", "bad.toml", "--out", "x"))
    assert "bad.toml: lookahead: must be on, off, true or false" in line


@pytest.mark.parametrize("args,message", [
    (["--tp", "3"], "error: --tp: 3 does not divide the model's 4 attention heads (--heads)"),
    (["--workload", "emulated", "--tp", "3"], "error: --tp: 3 does not divide the emulated layer's 32 features"),
    (["--tp", "0"], "error: --tp: must be a whole number >= 1, got 0"),
    (["--dp", "0"], "error: --dp: must be a whole number >= 1, got 0"),
    (["--tp", "2", "--dp", "2", "--nproc", "4"], "error: --nproc: 4 processes cannot run 2 pipeline ranks x tp 2 x dp 2 = 8 processes"),
    (["--workload", "examples.llama_pipeline:build", "--tp", "2"],
     "error: --tp: examples.llama_pipeline:build shards nothing under --tp 2: give PipelineModel.tp_plan"),
    (["--workload", "tests.helpers.user_models:plan_names_a_missing_module", "--tp", "2"],
     "error: --workload: stage 0's tp_plan names 'mlp.down', which is no submodule of its MLPStage (its children: "
     "embed, norm, up, down)"),
    (["--workload", "tests.helpers.user_models:stages_disagree"],
     "error: --workload: stage 1 (_Narrow) cannot take stage 0's outputs ([2, 8]): RuntimeError:"),
    (["--chunks", "2", "--hint", "interleaved-1f1b", "--microbatches", "5"], "must be a multiple of 2"),
    (["--hint", "nope"], "unknown hint 'nope'"),
    (["--chunks", "2", "--memory-budget", "1"], "below the smallest that can complete"),
    (["--workload", "video"], "error: --workload: 'video' is not one of gpt, multimodal, emulated"),
    (["--delay", "1B0"], "error: --delay: '1B0' is not TASK=SECONDS"),
    (["--fail-at", "zz"], "error: --fail-at: 'zz' is not a task"),
    (["--policy", "fixed", "--lookahead", "on"], "error: --lookahead: applies to --policy ready only"),
    (["--policy", "fixed", "--memory-budget", "abc"], "error: --memory-budget: 'abc' is not a budget"),
    (["--fail-at", "9F0"], "error: --fail-at: 9F0 is not a task of this run (2 ranks x 1 chunks, 8 microbatches)"),
    (["--hang-at", "0I1"], "error: --hang-at: 0I1 is not a task of this run"),  # 1f1b does not split B
    (["--hint", "zbv", "--chunks", "3"], "error: --chunks: V placement holds 2 chunks per rank (stages r and 2p-1-r); "
                                         "got 3"),
    (["--placement", "v", "--chunks", "1"], "error: --chunks: V placement holds 2 chunks per rank (stages r and "
                                            "2p-1-r); got 1"),
    (["--hint", "zb", "--placement", "v"], "zb places stages in a loop (stage k on rank k % p); it has no v order"),
    (["--placement", "w"], "error: --placement: 'w' is not one of looping, v"),
    (["--delay", "9B0=0.1"], "error: --delay: 9B0 is not a task of this run"),
    (["--fail-at", "1F0@7", "--iters", "2"], "error: --fail-at: '1F0@7' is never reached: the run has 2 iterations"),
    (["--trace-iters", "10:20", "--iters", "2"], "error: --trace-iters: '10:20' traces nothing: the run has 2"),
    (["--device", "cuda"], "error: --device: cuda needs CUDA, which this machine does not have"),
    (["--backend", "nccl"], "error: --backend: nccl needs CUDA, which this machine does not have"),
])
def test_bad_input_fails_before_any_rank_starts(tmp_path, args, message):
    if "CUDA" in message:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    began = time.monotonic()
    line = one_error_line(run_cli(tmp_path, "run", "--stages", "2", *args, "--out", "x"))
    assert message in line
    assert time.monotonic() - began < 20
    assert not (tmp_path / "x").exists()  # nothing started, nothing written


@pytest.mark.parametrize("address, message", [
    ("not-a-host", "error: RRFP_SOCKET_ADDR: 'not-a-host': "),
    ("192.0.2.1", "error: RRFP_SOCKET_ADDR: cannot listen on 192.0.2.1 (from RRFP_SOCKET_ADDR): "),  # TEST-NET-1
])
def test_a_socket_address_this_host_cannot_listen_on_fails_before_any_rank_starts(tmp_path, monkeypatch, address,
                                                                                  message):
    monkeypatch.setenv("RRFP_SOCKET_ADDR", address)
    assert one_error_line(run_cli(tmp_path, "run", "--stages", "2", "--out", "x")).startswith(message)
    assert not (tmp_path / "x").exists()


def test_bad_config_file(tmp_path):
    (tmp_path / "bad.toml").write_text('stages = 2\nmicro-batches = 4\n')
    line = one_error_line(run_cli(tmp_path, "run", "--config", "bad.toml"))
    assert "unknown key 'micro-batches'; did you mean 'microbatches'?" in line
    (tmp_path / "worse.toml").write_text('stages = \n')
    assert "not valid TOML" in one_error_line(run_cli(tmp_path, "run", "--config", "worse.toml"))


@pytest.mark.parametrize("text, message", [
    ("hint = 5", "error: job.toml: hint: must be a string, got 5"),
    ('hint = ["1f1b"]', "error: job.toml: hint: must be a string, got ['1f1b']"),
    ("out = 5", "error: job.toml: out: must be a string, got 5"),
    ('memory-budget = ["2x"]', "error: job.toml: memory-budget: must be 1f1b, a multiple such as 2x, or slots"),
])
def test_config_values_of_the_wrong_type(tmp_path, text, message):
    (tmp_path / "job.toml").write_text(text + "\n")
    assert message in one_error_line(run_cli(tmp_path, "run", "--config", "job.toml"))
    assert not (tmp_path / "runs").exists()


def test_config_file_that_is_a_directory_and_out_that_cannot_be_made(tmp_path):
    assert one_error_line(run_cli(tmp_path, "run", "--config", ".")) == "error: .: is a directory, not a TOML file"
    (tmp_path / "afile").write_text("")
    line = one_error_line(run_cli(tmp_path, "run", "--out", "afile/run"))
    assert line == "error: --out: cannot create afile/run: Not a directory"


def test_hint_file_of_another_shape(tmp_path):
    assert run_cli(tmp_path, "hints", "export", "1f1b", "-p", "2", "-m", "8", "--out", "h.json").returncode == 0
    line = one_error_line(run_cli(tmp_path, "run", "--stages", "2", "--microbatches", "4", "--hint", "h.json"))
    assert "the file is for microbatches 8 but --microbatches 4 was asked" in line


def test_out_never_reuses_a_directory_that_holds_files(tmp_path):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "metrics.parquet").write_text("earlier run")
    result = run_cli(tmp_path, "run", "--workload", "emulated", "--iters", "1", "--out", "used")
    assert result.returncode == 2
    assert result.stderr.strip() == "error: --out: used already holds files; give a new or empty directory"
    assert (tmp_path / "used" / "metrics.parquet").read_text() == "earlier run"


def test_an_empty_out_is_claimed_and_handed_to_the_ranks(tmp_path, monkeypatch):
    """An empty --out is accepted and used: claimed, and given to the launch as the run's directory. The launch
    is stopped there (the ranks would only run the job); tests/multiproc/test_run.py runs one into an empty
    --out to the end."""
    import runtime.run.launch as launch

    asked = []

    def stopped_at_the_launch(jobs, options, nproc, checked=False):
        asked.append((options.out_root, [job.out_dir for job in jobs], nproc))
        raise launch.RunFailed("stopped by the test before any rank started")

    monkeypatch.setattr(launch, "launch", stopped_at_the_launch)
    (tmp_path / "empty").mkdir()
    result = run_cli(tmp_path, "run", "--workload", "emulated", "--iters", "1", "--forward-time", "0.002",
                     "--out", "empty")
    assert result.returncode == 1 and "run failed: stopped by the test before any rank started" in result.stderr
    assert asked == [("empty", ["empty"], 2)]


def test_rrfp_run_refuses_blocking_under_ready_with_one_line(tmp_path):
    done = run_cli(tmp_path, "run", "--workload", "gpt", "--stages", "2", "--policy", "ready", "--p2p",
                   "blocking", "--out", str(tmp_path / "run"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: --p2p: blocking applies to --policy fixed only (this is ready): readiness-first runs whatever "
        "message has arrived, so it cannot post its receives in a fixed order"]
    assert not (tmp_path / "run").exists()


def test_rrfp_run_refuses_an_order_that_deadlocks_under_blocking(tmp_path):
    done = run_cli(tmp_path, "run", "--workload", "gpt", "--stages", "2", "--chunks", "2", "--microbatches", "4",
                   "--policy", "fixed", "--p2p", "blocking", "--out", str(tmp_path / "run"))
    assert done.returncode == 2
    assert done.stderr.startswith("error: hint interleaved-1f1b: cannot complete with blocking p2p")
    assert not (tmp_path / "run").exists()


def test_bad_checkpoint_and_factory_input_is_one_error_line(tmp_path):
    (tmp_path / "empty").mkdir()
    assert one_error_line(run_cli(tmp_path, "run", "--resume", "empty")) == (
        "error: --resume: empty holds no checkpoint (runs write them with --checkpoint-every K)")
    assert one_error_line(run_cli(tmp_path, "run", "--resume", "missing")) == (
        "error: --resume: missing is not a directory")
    assert one_error_line(run_cli(tmp_path, "run", "--checkpoint-every", "0", "--out", "x")) == (
        "error: --checkpoint-every: must be a whole number >= 1, got 0")
    line = one_error_line(run_cli(tmp_path, "run", "--workload", "no_such_package.models:build", "--out", "x"))
    assert line.startswith("error: --workload: cannot import no_such_package.models: ModuleNotFoundError")
    line = one_error_line(run_cli(tmp_path, "run", "--workload", "tests.helpers.user_models:missing", "--out", "x"))
    assert line == "error: --workload: tests.helpers.user_models has no callable 'missing'"
    line = one_error_line(run_cli(tmp_path, "run", "--workload", "tests.helpers.user_models:one_stage_too_many",
                                  "--stages", "2", "--out", "x"))
    assert line == "error: --workload: the factory returned 3 stage modules for 2 model stages (0, 1)"
    assert not (tmp_path / "x").exists()
