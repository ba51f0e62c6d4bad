"""The RL prompt set of the ``mappo`` and ``retriever_rl`` stages: questions with gold answers.

One loader for both stages, below both loops, so that neither imports the other's workflow (the
``retriever_rl`` loop imported the MAPPO workflow for it, closing an import cycle).
"""

from __future__ import annotations

from mmoa.data.loaders import load_qa
from mmoa.data.records import QARecord
from mmoa.data.registry import resolve_dataset


def load_mappo_records(dataset: str, dataset_dir: str, max_samples: int | None) -> list[QARecord]:
    """The prompt set, resolved through ``dataset_info.json``; every record needs answers."""
    records: list[QARecord] = []
    for name in [n.strip() for n in dataset.split(",") if n.strip()]:
        path, fmt = resolve_dataset(name, dataset_dir)
        loaded = load_qa(path, fmt, max_samples=max_samples)
        without = [r.id for r in loaded if not r.answers]
        if without:
            raise ValueError(f"dataset {name!r} ({path}): {len(without)} questions have no gold "
                             f"answers (e.g. {without[0]!r}); MAPPO rewards need them")
        records.extend(loaded)
    if not records:
        raise ValueError(f"dataset {dataset!r} has no questions")
    return records
