"""Data preparation: the corpora (``corpora``), the steps that turn one into fairseq data
(``fetch``: the published files, verified; ``process``: from text to binarized data, on
``textproc``), the runner that skips, resumes and stamps them (``pipeline``), and the
manifest a prepared directory carries (``manifest``).
Command line: ``resnmt-prepare`` (``resnmt.cli.prepare``)."""
