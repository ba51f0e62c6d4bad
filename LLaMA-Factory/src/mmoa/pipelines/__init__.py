"""Pipelines by name: each implements :class:`~mmoa.pipelines.base.Pipeline` in its own module
and registers it with :func:`~mmoa.pipelines.base.register_pipeline`.

* ``qr_s_g`` - Query Rewriter -> retrieval -> Selector -> Generator (MMOA-RAG; the default);
* ``search_agent`` - one multi-turn agent that searches (RAG-R1 / Search-R1);
* ``decision_agent`` - answer, or search first at a cost per search (SmartRAG).

``mappo_pipeline`` picks one for training, the evaluation's ``mode`` for evaluation. A new
pipeline is one module here plus its import below; the import order is the order of the
evaluation's modes. Nothing here loads torch (the command line reads the modes).
"""

# isort: off
from mmoa.pipelines import qr_s_g, search_agent, decision_agent
# isort: on
from mmoa.pipelines.base import (
    Batch,
    Evaluator,
    Pipeline,
    Timings,
    eval_modes,
    get_pipeline,
    pipeline_for_mode,
    pipeline_names,
    register_pipeline,
)

__all__ = ["Batch", "Evaluator", "Pipeline", "Timings", "decision_agent", "eval_modes",
           "get_pipeline", "pipeline_for_mode", "pipeline_names", "qr_s_g", "register_pipeline",
           "search_agent"]
