"""A tiny NVTX emitter for the toolchain test: nested `ddtree` ranges on two threads and a mark.

Run as `python nvtx_program.py IDS_FILE`; it writes each thread's native id there so the test can
check the thread ids nsys recorded (nsys keeps the program's stdout inside the report).
"""

import json
import sys
import threading

import nvtx

DOMAIN = "ddtree"


def work(label: str, ids: dict) -> None:
    ids[label] = threading.get_native_id()
    nvtx.push_range(f"outer_{label}", domain=DOMAIN)
    nvtx.push_range(f"inner_{label}", domain=DOMAIN)
    sum(range(10_000))
    nvtx.pop_range(domain=DOMAIN)
    nvtx.pop_range(domain=DOMAIN)


def main() -> None:
    ids: dict[str, int] = {}
    work("a", ids)
    thread = threading.Thread(target=work, args=("b", ids))
    thread.start()
    thread.join()
    nvtx.mark("tokens", payload=12345, domain=DOMAIN)
    with open(sys.argv[1], "w") as f:
        json.dump(ids, f)


if __name__ == "__main__":
    main()
