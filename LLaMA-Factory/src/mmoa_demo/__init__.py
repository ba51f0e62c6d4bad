"""Demo-only code, kept out of the ``mmoa`` library: the generated demo world and the tiny model.

The library trains and evaluates a RAG pipeline on any dataset and any local model; nothing in
``mmoa`` imports this package. It serves the demo (``run_demo.sh``), the test suite's fast model
and the ``mmoa-cli data demo-world`` / ``pretrain`` / ``known-split`` verbs, which it adds to the
library's command line as a plugin (:mod:`mmoa_demo.cli`, entry point group ``mmoa.cli.data``):

* :mod:`mmoa_demo.world`: the seeded synthetic encyclopedia and its multi-hop QA splits (written in
  the unified schema, so ``mmoa.data`` reads them like any other dataset);
* :mod:`mmoa_demo.pretrain_text`: pre-training text for the tiny model, from worlds of other seeds;
* :mod:`mmoa_demo.tiny_model`: the few-million-parameter Llama with its own Llama-3-style
  tokenizer.

It ships in the same distribution as ``mmoa`` (a second top-level package), so an installed
``mmoa-cli`` keeps its demo verbs.
"""
