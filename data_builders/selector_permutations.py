"""Selector-only SFT records with the candidates shuffled: every Selector record of an SFT file
(``mmoa-cli data sft``'s, or any builder's) in ``--copies`` random candidate orders, its label
renumbered to match, written as an Alpaca dataset and registered in ``--output_dir``. For
continued training of the Selector alone, where the rank order lets it fit its labels without
reading the documents (logic and rationale: ``mmoa.data.selector_permutations``;
docs/real_workflow.md). From records with more candidates than the pipeline shows, each copy
can be a random ``--subset_size`` of them instead (many distinct records per question).

Example (the warm start's data folder from bench/side_by_side.py, then a Selector-only epoch):
  python data_builders/selector_permutations.py --input saves/work/data-<key>/sbs_sft.json \\
      --output_dir data/selector_shuffled --copies 1 --seed 1
  bash LLaMA-Factory/run_sft.sh LLaMA-Factory/examples/demo/smollm2_full_sft.yaml \\
      model_name_or_path=<the warm start> dataset=selector_shuffled \\
      dataset_dir=data/selector_shuffled output_dir=saves/selector_shuffled max_steps=-1 \\
      num_train_epochs=1 cutoff_len=2048 per_device_train_batch_size=2 gradient_accumulation_steps=2
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mmoa.data.selector_permutations import SUBSET_ORDERS, permuted_selector_records
from mmoa.data.sft_builder import SFTBuildConfig, SFTBuildReport, write_sft_dataset
from mmoa.fileio import DataFormatError, read_utf8_text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="an Alpaca SFT file (a JSON list)")
    parser.add_argument("--output_dir", required=True,
                        help="the dataset folder to write into (dataset_info.json is updated)")
    parser.add_argument("--name", default="selector_shuffled", help="the dataset's name")
    parser.add_argument("--copies", type=int, default=1,
                        help="random orders of each Selector record (default 1)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep_given_order", action="store_true",
                        help="also write each Selector record in its own (retrieval) order, "
                             "before its shuffled copies")
    parser.add_argument("--subset_size", type=int, default=None,
                        help="each copy shows a random N of the record's candidates (records "
                             "built with more candidates than the pipeline shows, e.g. data sft "
                             "--k 10 for a K = 5 Selector); default: all of them, shuffled")
    parser.add_argument("--subset_order", choices=SUBSET_ORDERS, default="shuffled",
                        help="with --subset_size: the drawn candidates in their retrieval order "
                             "(ranked) or shuffled (default)")
    args = parser.parse_args(argv)
    prefix = f"{Path(sys.argv[0]).name}: error:"
    try:
        records = json.loads(read_utf8_text(args.input))
        if not isinstance(records, list):
            raise DataFormatError(f"{args.input}: an Alpaca SFT file is a JSON list of records")
        out, found = permuted_selector_records(records, args.copies, args.seed,
                                               args.keep_given_order, args.subset_size,
                                               args.subset_order)
        if not found:
            raise DataFormatError(f"{args.input}: no Selector record among {len(records)}")
    except (OSError, ValueError) as err:  # DataFormatError and JSONDecodeError are ValueErrors
        print(f"{prefix} {err} (nothing was written)", file=sys.stderr)
        return 2
    path = write_sft_dataset(out, SFTBuildConfig(dataset_dir=args.output_dir, name=args.name),
                             SFTBuildReport())
    detail = f", {found} of them in their own order" if args.keep_given_order else ""
    if args.subset_size is not None:
        detail += f", subsets of {args.subset_size} ({args.subset_order})"
    print(f"{found} Selector records of {len(records)} -> {len(out)} records in {path}{detail} "
          f"(dataset {args.name!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
