"""`convgen bench`, in parts that each do one job:

* :mod:`.rows`: what a row runs and counts (traffic, FLOPs, floor, what each side computes);
* :mod:`.stats`: time summaries, rates and geometric means;
* :mod:`.report`: summaries, the text report, file names and the JSON;
* :mod:`.plot`: the speedup plot (matplotlib);
* :mod:`.harness`: the GPU session (CuPy, torch/cuDNN, data, ceilings, each row's timing);
* :mod:`.command`: the command line.

Timing itself is :mod:`convgen.tools.timing`, shared with `convgen tune`.  Only the
harness touches a GPU, and nothing imports CuPy, torch or matplotlib at import time.
"""
