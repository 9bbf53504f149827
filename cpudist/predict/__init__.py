"""`cpudist predict`: a trained model's predictions on a file or a GLUE split.

source.py finds the model and what its run recorded, inputs.py reads the rows (as `cpudist run`
reads data), outputs.py writes predictions and GLUE's submission file; none imports torch. infer.py
runs the model (the same sorted, sharded batches as the run's evaluation), worker.py is one `--np`
process, and job.py splits the rows across processes and gathers them in input order.
"""
