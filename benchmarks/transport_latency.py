"""One-way latency of a message: rrfp's transport against plain gloo send/recv, side by side.

    .venv/bin/python benchmarks/transport_latency.py [--sizes 2048,1048576] [--round-trips 1000] [--rounds 20]
    .venv/bin/python benchmarks/transport_latency.py --breakdown [--sizes 2048] [--round-trips 2000]

Two ranks on this machine ping-pong messages of each payload size (bytes of
float32), once with ``dist.send``/``dist.recv`` on the main threads and once
through :class:`runtime.comm.transport.Transport` (post, frame on the link's socket,
the dispatcher reads it in ``Inbox.wait``/``drain``; a payload over
``INLINE_BYTES`` goes on gloo first, into a pre-posted receive). The paths
take turns in ``--rounds`` blocks, so load on a shared machine falls on all
alike (turns of one round trip would charge each path with what the other
left running in the background). Prints the median one-way time (half the
round trip) of each path and their ratio, against the targets of issue 9
(1.5x at 2 KiB, 1.1x at 1 MiB).

A third path measures the floor of a transport that would learn of gloo
arrivals without polling (gloo's ``irecv(...).is_completed()`` stays False
until ``wait()``): a bare receiver thread that does blocking receives on a
group of its own into a ready buffer and wakes the main thread through a
``queue.SimpleQueue``, no framing, no bookkeeping. The transport reads its
frames on the dispatcher instead ([Note: dispatcher reads the sockets] in
``runtime/comm/sockets.py``), so it does not pay that hand-off.

``--breakdown`` runs the transport path alone, rank 0 sending to rank 1, and
times each step of a one-way message on the clock both ranks share
(``time.monotonic_ns``, one host): the send call on the sender, in it the
framing and writing (``Wire.isend``) and the framing alone, the wire (the
send call's end to the receiver's first read of the message's bytes), the
reading (from those first bytes until the message is listed for the
dispatcher), and the rest of the dispatcher's ``wait``/``drain``. The steps
are timed by thin wrappers around those functions, which add about a
microsecond each; medians after the first 10% of messages.
"""

from __future__ import annotations

import statistics
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # before torch: no numpy here

from _cli import Parser, run  # benchmarks/_cli.py: this script's folder is on sys.path

from runtime.run.launch import free_port

TARGETS = {2048: 1.5, 1 << 20: 1.1}  # ratio to plain gloo (issue 9)


PATHS = ("plain", "thread", "transport")


def worker(sizes: list[int], round_trips: int, rounds: int) -> dict[int, tuple[tuple[float, ...], tuple[float, ...]]]:
    """``{size: (one-way seconds of each of PATHS, minor page faults per round trip of each)}``; the times are
    medians over every round trip, the faults this rank's."""
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import queue
    import resource
    import threading

    import torch
    import torch.distributed as dist

    from hints.tasks import F, Task
    from runtime.comm.transport import Transport

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    transport = Transport(rank, [(0, 1), (1, 0)], torch.device("cpu"), timeout=30)
    transport.start(timeout=30)
    pair = dist.new_group([0, 1])  # the bare receiver thread's own group
    arrived: queue.SimpleQueue = queue.SimpleQueue()
    inbound = {size: torch.zeros(size // 4) for size in sizes}
    posted = queue.SimpleQueue()  # the size of the next receive, or None to stop

    def receiver() -> None:
        while (size := posted.get()) is not None:
            pair.recv([inbound[size]], 1 - rank, 0).wait()
            arrived.put(size)

    def plain(payload: torch.Tensor) -> None:
        if rank == 0:
            dist.send(payload, 1)
            dist.recv(payload, 1)
        else:
            dist.recv(payload, 0)
            dist.send(payload, 0)

    def receive() -> None:
        while not transport.inbox.drain():
            transport.inbox.wait(1.0)

    sends: list = []

    def through_thread(payload: torch.Tensor) -> None:
        posted.put(payload.numel() * 4)  # the receive is posted before the peer sends, as the transport's is
        if rank == 0:
            sends.append(pair.send([payload], 1, 0))
            arrived.get()
        else:
            arrived.get()
            sends.append(pair.send([payload], 0, 0))
        if len(sends) >= 8:  # the transport's collection, every MAX_UNCOLLECTED sends
            for work in sends:
                work.wait()
            sends.clear()

    def through_transport(payload: torch.Tensor) -> None:
        if rank == 0:
            transport.send(1, 0, Task(0, F, 0), (payload,))
            receive()
        else:
            receive()
            transport.send(0, 0, Task(1, F, 0), (payload,))

    thread = threading.Thread(target=receiver, daemon=True)
    thread.start()
    times: dict[tuple[int, str], list[float]] = {}
    faults: dict[tuple[int, str], int] = {}
    for _ in range(rounds):  # the paths take turns in blocks, so load on a shared machine falls on both alike
        for size in sizes:
            payload = torch.zeros(size // 4)
            paths = {"plain": plain, "thread": through_thread, "transport": through_transport}
            for name, exchange in paths.items():
                dist.barrier()
                exchange(payload)  # a first exchange settles what the other path left running
                faulted = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                for _ in range(max(1, round_trips // rounds)):
                    began = time.perf_counter()
                    exchange(payload)
                    times.setdefault((size, name), []).append(time.perf_counter() - began)
                faults[size, name] = (faults.get((size, name), 0) + resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                                      - faulted)
    for work in sends:
        work.wait()
    posted.put(None)
    thread.join()
    transport.close()
    dist.barrier()
    dist.destroy_process_group()
    return {size: (tuple(statistics.median(times[size, name]) / 2 for name in PATHS),
                   tuple(faults[size, name] / len(times[size, name]) for name in PATHS)) for size in sizes}


STEPS = ("send call", "  of it: framing and writing (Wire.isend)", "  of it: framing (pack_frame)",
         "wire (send returned -> first bytes read by the receiver)",
         "reading: first bytes read -> message listed", "dispatcher: listed -> drain returned", "one way, in all")


def breakdown_worker(size: int, messages: int) -> list[float]:
    """Median microseconds of each of STEPS (rank 0's return value); rank 0 sends, rank 1 receives."""
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch
    import torch.distributed as dist

    import runtime.comm.links as links
    import runtime.comm.sockets as sockets
    from hints.tasks import F, Task
    from runtime.comm.transport import Transport

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    marks: dict[str, list[int]] = {name: [] for name in ("send_in", "send_out", "isend", "frame", "read",
                                                         "listed", "awake")}
    clock, measuring = time.monotonic_ns, [False]

    def timed(function, name):
        def wrapper(*args, **kwargs):
            began = clock()
            result = function(*args, **kwargs)
            if measuring[0]:
                marks[name].append(clock() - began)
            return result
        return wrapper

    first_bytes: list[int | None] = [None]  # when the receiver first read bytes of the message it lists next

    def received(function):
        def wrapper(reader, into):
            result = function(reader, into)
            if measuring[0] and result[0] is not None and first_bytes[0] is None:
                first_bytes[0] = clock()
            return result
        return wrapper

    def listed(function):  # a read that lists a message: from its first bytes to here
        def wrapper(reader, out):
            count = len(out)
            result = function(reader, out)
            if measuring[0] and len(out) > count:
                marks["read"].append(first_bytes[0])
                marks["listed"].append(clock())
                first_bytes[0] = None
            return result
        return wrapper

    links.pack_frame = timed(links.pack_frame, "frame")  # the name Wire.isend calls
    links.Wire.isend = timed(links.Wire.isend, "isend")
    sockets.SocketReader._receive = received(sockets.SocketReader._receive)
    sockets.SocketReader.read = listed(sockets.SocketReader.read)
    transport = Transport(rank, [(0, 1), (1, 0)], torch.device("cpu"), timeout=30)
    transport.start(timeout=30)
    payload, inbox = torch.zeros(size // 4), transport.inbox
    measuring[0] = True
    dist.barrier()  # both ranks measure before the first message: one mark per message on each side
    for _ in range(messages):
        if rank == 0:
            marks["send_in"].append(clock())
            transport.send(1, 0, Task(0, F, 0), (payload,))
            marks["send_out"].append(clock())
            while not inbox.drain():  # the acknowledgement: one message at a time on the wire
                inbox.wait(1.0)
        else:
            while not inbox.drain():
                inbox.wait(1.0)
            marks["awake"].append(clock())
            transport.send(0, 0, Task(1, F, 0), (payload,))
    measuring[0] = False
    if rank == 1:  # its marks to rank 0, which computes the spans
        dist.send(torch.tensor(marks["read"] + marks["listed"] + marks["awake"], dtype=torch.int64), 0)
    else:
        theirs = torch.empty(3 * messages, dtype=torch.int64)
        dist.recv(theirs, 1)
    transport.close()
    dist.barrier()
    dist.destroy_process_group()
    if rank != 0:
        return []
    read, listed, awake = (theirs[i * messages:(i + 1) * messages].tolist() for i in range(3))
    spans = {
        STEPS[0]: [b - a for a, b in zip(marks["send_in"], marks["send_out"])],
        STEPS[1]: marks["isend"], STEPS[2]: marks["frame"],
        STEPS[3]: [b - a for a, b in zip(marks["send_out"], read)],
        STEPS[4]: [b - a for a, b in zip(read, listed)],
        STEPS[5]: [b - a for a, b in zip(listed, awake)],
        STEPS[6]: [b - a for a, b in zip(marks["send_in"], awake)],
    }
    skip = messages // 10
    return [statistics.median(spans[step][skip:]) / 1000 for step in STEPS]


def table(results: dict[int, tuple[tuple[float, ...], tuple[float, ...]]], round_trips: int, rounds: int) -> str:
    lines = [f"median one-way latency (half the round trip), {round_trips} round trips per path and size, "
             f"the three paths taking turns in {rounds} blocks",
             "", "| payload | gloo dist.send / dist.recv | gloo + receiver thread (floor) | rrfp Transport | "
             "floor / gloo | Transport / gloo | target |", "|---|---|---|---|---|---|---|"]
    for size, ((plain, floor, ours), _) in results.items():
        target = TARGETS.get(size)
        lines.append(f"| {_size(size)} | {plain * 1e6:.0f} us | {floor * 1e6:.0f} us | {ours * 1e6:.0f} us | "
                     f"{floor / plain:.2f}x | {ours / plain:.2f}x | " + (f"{target}x |" if target else "- |"))
    lines += ["", "minor page faults per round trip on rank 0 (a receive into fresh pages faults each one in): " +
              "; ".join(f"{_size(size)}: " + ", ".join(f"{name} {count:.1f}" for name, count in zip(PATHS, counts))
                        for size, (_, counts) in results.items())]
    return "\n".join(lines)


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB" if nbytes >= 1024 else f"{nbytes} B"


def main() -> None:
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2048,1048576", help="payload sizes in bytes, comma-separated")
    parser.add_argument("--round-trips", type=int, default=1000, help="per path and size")
    parser.add_argument("--rounds", type=int, default=20, help="blocks the round trips are split into")
    parser.add_argument("--breakdown", action="store_true", help="where a transport message's time goes, per step")
    args = parser.parse_args()
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes: {args.sizes!r} is not a comma-separated list of byte counts, e.g. 2048,1048576")
    if any(size < 4 or size % 4 for size in sizes):  # payloads are float32 tensors of size / 4 elements
        parser.error(f"--sizes: every size must be a positive multiple of 4 bytes, got {args.sizes}")
    parser.at_least(args, 1, "round_trips", "rounds")
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, rdzv_backend="c10d",
                          rdzv_endpoint=f"127.0.0.1:{free_port()}", max_restarts=0, run_id="latency")
    if args.breakdown:
        print(f"median microseconds per step of a one-way transport message (rank 0 -> rank 1), "
              f"{args.round_trips} messages per size, the first 10% left out\n")
        print("| step | " + " | ".join(_size(size) for size in sizes) + " |")
        print("|---|" + "---|" * len(sizes))
        columns = [elastic_launch(config, breakdown_worker)(size, args.round_trips)[0] for size in sizes]
        for i, step in enumerate(STEPS):
            print(f"| {step} | " + " | ".join(f"{column[i]:.1f}" for column in columns) + " |")
        from runtime.comm.frames import INLINE_BYTES

        if any(size > INLINE_BYTES for size in sizes):
            print(f"\nA payload over {INLINE_BYTES} bytes follows its frame as a body: the receiver reads its first "
                  f"bytes while the send call still writes the rest (the wire step can be negative), and the "
                  f"reading step lasts until the last bytes are in.")
        return
    results = elastic_launch(config, worker)(sizes, args.round_trips, args.rounds)[0]
    print(table(results, args.round_trips, args.rounds))


if __name__ == "__main__":
    run(main)
