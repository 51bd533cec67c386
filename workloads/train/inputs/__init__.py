"""What a run trains on, turned into batches: ``batches`` (the :class:`Batch` the loop steps, and
the token-id sources: synthetic, ``.bin``/``.npy`` files), ``text`` (text and chat data sets, read
in pieces, tokenized, packed, resumable) with ``text_units`` (the pieces a data set is read in)
and ``text_encode`` (records to token documents for one objective), and ``facts`` (the made-up
``park:facts`` corpus, shipped as ``workloads/train/data/facts.jsonl``)."""
