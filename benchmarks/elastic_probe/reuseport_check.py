"""Do two TCPStore servers bind the same port? (Why co-located torchrun agents can split brain.)"""
import subprocess
import sys
import time

code = ("import torch.distributed as d, time; s=d.TCPStore('127.0.0.1', 29455, is_master=True, "
        "wait_for_workers=False); print('bound', flush=True); time.sleep(4)")
a = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                     text=True)
time.sleep(2.5)
b = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
print("second server:", (b.stdout + b.stderr).strip().splitlines()[-1][:200])
a.wait()
