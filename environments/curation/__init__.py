"""Data curation: synthesised tasks from real PyPI projects, importers for SWE-bench-style sets,
splits and decontamination, content-addressed datasets, and validation on real images.

Entry points (plain functions, no Prefect): `curate.curate_synth`, `importers.import_tasks`,
`validate.validate_tasks`, `dataset.save_dataset` / `load_dataset` / `list_datasets`.
"""
