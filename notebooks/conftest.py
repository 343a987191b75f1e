"""nbval runs every notebook here at smoke size: the kernels inherit DPPO_SMOKE=1 from this process."""
import os

os.environ["DPPO_SMOKE"] = "1"
