"""Hints on disk and from torch: ``rrfp-hint/1``/``/2`` JSON (:mod:`~hints.files.hint_json`), torch's
schedule CSV (:mod:`~hints.files.torch_csv`; its export runs torch's lowering when torch imports), torch's schedule names (:mod:`~hints.files.torch_names`) and
orders (:mod:`~hints.files.torch_import`, imports torch when called), and the one reading of a ``--hint``
value with the shape options (:mod:`~hints.files.load`)."""
