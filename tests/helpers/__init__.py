"""What tests share; no test module imports another test module.

* ``cli``: the two ways to run ``rrfp`` (in this process, ``run_cli``; as a user does, ``run_rrfp``) and the
  scripts (``run_script``), and what tests assert on a command's output ([Note: the two CLI runners]).
* ``schedules``: small hand-made hints and duration tables for the scheduling tests.
* ``jobs``: lists of jobs run on real ranks in one launch, and their checks against the single-process
  reference (``run_jobs`` runs ``runtime_harness`` in a subprocess with a hard timeout).
* ``processes``: waiting on runs and processes (status boards, live ranks, a condition with a timeout).
* ``trace_builder``: hand-built traces with known answers, written by the real ``TraceRecorder``.
* ``user_models``: model factories for ``--workload tests.helpers.user_models:NAME``.
* ``runtime_harness``, ``pipeline_script``: programs the tests start (``python -m tests.helpers.NAME``).
"""
