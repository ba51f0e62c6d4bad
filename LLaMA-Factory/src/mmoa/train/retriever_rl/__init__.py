"""The query encoder's RL stage (``stage: retriever_rl``; HARR, arXiv 2602.03645).

The generator is frozen and only the dense retriever's query encoder learns, with GRPO on the
Plackett-Luce log-probabilities of sampled retrievals (``mmoa.retrieval.sampling``) against the
index's frozen passage vectors. Modules, each with one job: ``args`` (the ``retriever_*`` keys),
``state`` (what the encoder embeds: question, sub-queries, history-aware state), ``policy`` (the
trainable encoder and the frozen passage vectors), ``learner`` (one GRPO update, on
``mmoa.train.mappo.ppo_math``), ``workflow`` (rollouts, server reloads, logs, checkpoints).
See docs/retriever_rl.md.
"""
