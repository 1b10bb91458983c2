
from ups.runs.view import _disk_full_verdicts
from ups.gpu import nvml as n
n._init()
def f(rep):
    return rep._gpu_sampler
