"""The project's defaults, defined once: the MMOA-RAG paper's hyperparameters and the agents'
token budgets.

The rollout settings, the penalties, the PPO update, the KL controller and the evaluation are
configured by separate dataclasses (``GenerationSettings``, ``PenaltyConfig``, ``PPOConfig``,
``AdaptiveKLController``, ``MappoArguments``, ``EvalConfig``); each takes its defaults from here,
so a value changed here changes everywhere and no copy can drift. Sources: MMOA-RAG Table 6 and
section 3.3, and its released code where the paper is silent (``../shared/reference``).
"""

from __future__ import annotations

from types import MappingProxyType

#: New tokens per agent turn: the original's 100 for the Query Rewriter and the Generator; 32 for
#: the Selector (its 29 fit "Document0,...,Document9" in the original tokenizer, not in every one).
MAX_NEW_TOKENS = MappingProxyType({"qr": 100, "selector": 32, "generator": 100})

#: The KV cache of the agents' ``generate`` calls (:mod:`mmoa.agents.generation_cache`):
#: ``dynamic`` (transformers' default, every CPU figure), ``static`` (compiled decoding on
#: CUDA) or ``auto`` (static on CUDA, dynamic elsewhere). Evaluation and inference keep
#: ``dynamic``: the static cache compiles once per process (about 60 s on an H200), which a
#: few hundred questions do not pay back.
GENERATION_CACHE = "dynamic"
#: The cache of MAPPO's rollouts: ``auto``, i.e. dynamic on a CPU (nothing changes there) and
#: the static cache on CUDA, where a training run pays its one compilation back within a few
#: dozen steps (H200, demo step of 16 questions: generation 3.9 -> 0.9 s, step 6.2 -> 3.5 s;
#: ``bench/results/gpu_check_h200_smollm2_bench_and_eval.json``).
ROLLOUT_GENERATION_CACHE = "auto"

# Rollout sampling (evaluation is greedy).
ROLLOUT_TEMPERATURE = 0.95
ROLLOUT_TOP_P = 0.9

# Query Rewriter: the sub-questions kept and the limits of its format penalty.
QR_MAX_SUBQUESTIONS = 4
QR_MAX_CHARS = 300

# Penalties (<= 0, added to the shared reward) and the Generator's length limit.
QR_PENALTY = -0.5
SELECTOR_PENALTY = -1.0
GENERATOR_PENALTY = -0.5
GENERATOR_MAX_WORDS = 30

# PPO.
PPO_EPOCHS = 2
CLIPRANGE = 0.2
CLIPRANGE_VALUE = 0.2
VF_COEF = 0.1
GAMMA = 1.0
LAM = 0.95
#: A mini-batch whose mean probability ratio exceeds this is skipped (trl's ratio_threshold).
RATIO_THRESHOLD = 10.0

# Adaptive KL controller: beta from 0.2 (the paper's beta_max) towards target 6, floor 0.06.
INIT_KL_COEF = 0.2
KL_TARGET = 6.0
KL_HORIZON = 10000.0
MIN_KL_COEF = 0.06

# GRPO (mappo_algorithm: grpo): rollouts per question, and the k3 KL loss weight (0: off, as in
# TRL's GRPOTrainer and Dr. GRPO; DeepSeekMath used 0.04).
GRPO_GROUP_SIZE = 4
KL_LOSS_COEF = 0.0

# The registered algorithms' own clip ranges (docs/mappo.md, Algorithms), used where the config
# leaves mappo_cliprange / mappo_cliprange_high unset. DAPO's clip-higher (Yu et al. 2025,
# section 3.1: eps_low 0.2, eps_high 0.28). GSPO's ratio is a response's geometric-mean token
# ratio, which stays within about 1e-3 of 1, so PPO's 0.2 would never clip it: the GSPO paper
# (Zheng et al. 2025, section 5.1) clips it to [1 - 3e-4, 1 + 4e-4].
DAPO_CLIPRANGE_HIGH = 0.28
GSPO_CLIPRANGE = 3e-4
GSPO_CLIPRANGE_HIGH = 4e-4
# DAPO's dynamic sampling (mappo_dapo_max_rounds): extra rollout rounds a step may make to fill
# its batch with groups whose rewards differ (0: none, the filter alone). The paper samples
# until the batch is full; the bound keeps a step's cost finite when nearly every group is flat.
DAPO_MAX_ROUNDS = 4
# DAPO's soft overlong punishment (mappo_overlong_buffer): the buffer L_cache as a share of each
# agent's generation budget L_max (the paper: 4096 of 20480 tokens, 0.2; 0 = off, the default)
# and the punishment at L_max (the paper's and verl's penalty_factor: 1).
OVERLONG_BUFFER = 0.0
OVERLONG_PENALTY_FACTOR = 1.0
# Truncated importance sampling (mappo_tis_cap): the cap verl's TIS and TRL's
# vllm_importance_sampling_cap use (2.0), documented here; the key is off (unset) by default.
TIS_CAP = 2.0

# The multi-turn search agent (``mappo_pipeline: search_agent``; RAG-R1 / Search-R1): queries per
# search (RAG-R1's multi-query variant allows 3), search rounds before the answer is forced
# (RAG-R1 trains with at most 4 retrievals), documents per query (both papers use top-3), new
# tokens per model turn (RAG-R1 allows 500 over the whole response) and the reward added when
# a trajectory ends malformed (0: off, as RAG-R1, whose SFT stage already teaches the format).
SEARCH_MAX_QUERIES = 3
SEARCH_MAX_TURNS = 4
SEARCH_TOP_K = 3
SEARCH_MAX_NEW_TOKENS = 128
SEARCH_FORMAT_PENALTY = 0.0

# The retrieve-or-answer decision agent (``mappo_pipeline: decision_agent``; SmartRAG): searches
# before the answer is forced (SmartRAG's quota), documents per search, new tokens per turn, and
# the reward ``answer reward - retrieval cost x searches - malformed penalty`` with SmartRAG's
# values (answer reward EM + F1, 0.2 per search, 1 for a malformed output).
DECISION_MAX_SEARCHES = 2
DECISION_TOP_K = 3
DECISION_MAX_NEW_TOKENS = 48
DECISION_RETRIEVAL_COST = 0.2
DECISION_MALFORMED_PENALTY = 1.0
DECISION_ANSWER_REWARD = "em_f1"

# Stochastic retrieval and the query encoder's RL stage (``stage: retriever_rl``; HARR, arXiv
# 2602.03645): the candidate pool (top by cosine score), the documents sampled from it without
# replacement, the softmax temperature over the pool's scores, GRPO's rollouts per question and
# its clip range (HARR: K=30, k=3, alpha 0.05, group 8, clip 0.2, no KL).
RETRIEVER_POOL_SIZE = 30
RETRIEVER_TOP_K = 3
RETRIEVER_ALPHA = 0.05
RETRIEVER_GROUP_SIZE = 8
RETRIEVER_CLIPRANGE = CLIPRANGE

# TOA data synthesis (tree search over several models; docs/toa.md): the UCB exploration weight
# and the temperature of the reward squashing sigmoid(r / tau) (both TOA's values), the width
# limit as a share of the budget (a layer holds samples x models / 3 responses before a model node
# may stop expanding, as in TOA), the samples per model of the default budget, and the weight of
# the gold-passage recall in the Selector's reward (added to the F1 of the frozen Generator).
TOA_ALPHA = 0.01
TOA_TAU = 0.1
TOA_WIDTH_DIVISOR = 3
TOA_SAMPLES_PER_MODEL = 4
TOA_SELECTOR_SUPPORT_WEIGHT = 0.5
# Questions searched together and kept on disk as one chunk by ``mmoa-cli data toa``: large
# enough to fill generate's batches (16 rows) many times over, small enough that a stopped run
# on a CPU loses minutes, not hours.
TOA_CHUNK_SIZE = 20

# The MAPPO drift monitor (:mod:`mmoa.train.mappo.agent_stats`): an agent statistic is flagged,
# and warned about once per run, when it moves this far from its value at the first step: the
# Selector's mean documents falls to this fraction of it or less (the demo's collapse went from
# 4.9 to 1), the gold recall of the selection or the candidates' gold recall falls by more than
# this many points (fractions: 0.20 = 20 points), or the answer length grows to this multiple.
DRIFT_SELECTED_FRACTION = 0.5
DRIFT_RECALL_DROP = 0.20
DRIFT_ANSWER_WORDS_RATIO = 2.0
# ... and an agent's mean k1 KL estimate to the reference (nats a token) falls below this: a
# KL is never negative, so a clearly negative estimate means the tokens are scored under a
# distribution other than the one they were sampled from (the Selector's grammar mask without
# ``mappo_masked_scoring``), and the KL reward is paying the agent a bonus.
DRIFT_NEGATIVE_KL = -0.1
# ... and the Selector's probability of selecting nothing (stopping at its first token, under
# its grammar; the demo's warm start: 0.014) rises by more than this (0.20 = 20 points): sampled
# at a low temperature it can still write documents while this grows, until the greedy Selector
# of evaluation selects nothing (a demo run: 0.26 three steps before the end, 0.75 at the end,
# 182 of 200 test questions answered without documents).
DRIFT_EMPTY_SELECTION_RISE = 0.20

# The ranges every stage's numeric keys are checked against when a config is parsed
# (:mod:`mmoa.config_values`), so that a value that would train nothing, or NaN, is one line
# naming the key before a model loads.
#: Sampling temperatures (rollouts, ``mmoa-cli eval --do_sample``): logits are divided by them.
#: Below 1e-2 sampling is greedy in all but name, while the scaled logits (100x and more) make
#: the scored log-probabilities tens to thousands of nats, so the PPO ratio exp(new - old) of the
#: smallest weight change overflows; 1e-320 became 0 in float32 and every logit inf or NaN.
#: vLLM raises any temperature below 1e-2 to 1e-2 for the same reason. Above 100 the scaled
#: logits of any model differ by a few hundredths (uniform noise), and a value above float32's
#: range (3.4e38) turned the Selector's masked (-inf) logits into NaN.
MIN_TEMPERATURE = 1e-2
MAX_TEMPERATURE = 100.0
#: Nucleus top-p and the PPO clip ranges: below 1e-6 (ten float32 steps around 1, whose
#: epsilon is 1.2e-7) top-p keeps the top token alone and a clip interval [1 - e, 1 + e] holds
#: hardly a representable ratio besides 1 (every token clipped). GSPO's 3e-4 / 4e-4 are well
#: above it.
MIN_PROBABILITY_RANGE = 1e-6
#: Upper clip range and value clip range: beyond 10 nothing is clipped in practice (PPO 0.2,
#: DAPO 0.28, a dual clip 3); the lower clip range stays below 1 (1 - e > 0, ratios are > 0).
MAX_CLIPRANGE = 10.0
#: Learning rates: an AdamW step moves a weight by about the learning rate, and below 1e-12
#: that is under float32's resolution (1.2e-7 x the weight) of any weight above 1e-5: a run
#: that trains nothing. 1e-320 (subnormal) was accepted and trained nothing.
MIN_LEARNING_RATE = 1e-12
#: The gradient clipping norm (``max_grad_norm``): a gradient is scaled to at most this norm,
#: and below 1e-6 (1e-320 was accepted) the clipped step times any learning rate is under
#: float32's resolution of the weights: nothing trains.
MIN_MAX_GRAD_NORM = 1e-6
#: Training steps in a row whose loss or gradient norm is not finite (each one skipped: no
#: optimiser step) before the run stops (``mappo_max_nonfinite_steps``,
#: ``retriever_max_nonfinite_steps``): a lone NaN batch is skipped, a diverged run is not
#: carried on.
MAX_NONFINITE_STEPS = 3
