"""What resnmt adds to decoding and scoring a trained model:

* ``sequence_generator``: beam search ranked with the GNMT length penalty (``--lenpen-form``
  of the ``resnmt_translation`` task);
* ``subword``: the data's own subword segmentation undone, and noticed when it was not;
* ``scoring``: sacreBLEU and tokenized BLEU the way the papers report them (``resnmt-evaluate``);
* ``token_bleu``: fairseq-generate's own BLEU line, labelled as not the papers' score.

Translating from Python (``resnmt.from_pretrained``) is ``resnmt.hub``, at the package's
face: it builds the task, which builds the generator here. This package imports nothing
itself: scoring loads without fairseq. Averaging checkpoints is ``resnmt.checkpoints``.
"""
