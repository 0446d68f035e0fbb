"""What resnmt adds to fairseq's training, each a patch or a registration of its own:

* ``bf16``: ``--bf16`` off TPUs, and the float32 master weights of ``--fp16``/``--bf16``
  runs kept in their checkpoints (exact resumption);
* ``optim``: ``--optimizer adam_fused``, fairseq's ``adam`` in multi-tensor kernels;
* ``compile``: ``--compile-layers``, each layer compiled for training, and the compiled
  elementwise chains of ``--fused-connections`` (SAS, NReLU/NSwish, which the model
  builds with them);
* ``attention``: ``--sdpa-backends``, the attention kernels torch may choose among;
* ``master_sync``: ``--fused-master-weights``, fairseq's per-parameter copies of the
  master weights in multi-tensor kernels;
* ``fast``: ``--fast-path``, static batch shapes, an update without host synchronisation
  and its steps captured as CUDA graphs (a package of its own);
* ``launch``: data-parallel ranks on the CPU with every launcher and DDP backend;
* ``quiet``: the third-party deprecation notices and dumps hidden at start-up;
* ``prefetch_exit``: a clean exit when training stops while batches are prefetched;
* ``resume``: several ranks resume without a flag and on any number of ranks, a bounded
  wait for a lost rank (``--distributed-timeout``) and whole checkpoints when one dies.

Each change to fairseq or torch among them is listed, and applied, in
``resnmt.fairseq_patches``; this package imports nothing itself, so that ``quiet`` and
``prefetch_exit`` load without torch or fairseq.
"""
