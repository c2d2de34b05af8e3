"""The image_folder example stopped mid-epoch and resumed trains on the
steps the uninterrupted run trained on. Usage: check_resume.py EXAMPLE WORK_DIR"""

import shutil
import subprocess
import sys


def steps(*args):
    out = subprocess.run(list(args), capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line.startswith("step ")]


def main():
    example, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    data = work + "/images"
    straight = steps(example, data, work + "/straight", "--epochs", "2")
    assert len(straight) == 30, f"240 images in batches of 16, two epochs: {len(straight)} steps"
    stopped = steps(example, data, work + "/stopped", "--epochs", "2", "--stop-at", "20")
    assert stopped == straight[:20], "the stopped run's first steps"
    resumed = steps(example, data, work + "/resumed", "--epochs", "2", "--resume", work + "/stopped/stopped.ckpt")
    tail = [line.split(" ", 2)[2] for line in straight[20:]]
    assert [line.split(" ", 2)[2] for line in resumed] == tail, "the resumed run's batches differ"
    print("resumed at step 20 of 30 (epoch 1, batch 5) with the uninterrupted run's batches")


if __name__ == "__main__":
    main()
