"""32 concurrent writers, fresh and stale tokens mixed, on ONE object: the database decides.
Whatever the interleaving, the version left visible is one written under the highest fence
any writer presented, every refusal was a fence below the highest, readers never see the
visible fence go down, and only the visible version's blob is left in the directory."""

from __future__ import annotations

import random
import threading

import httpx

from tests.proxy.objects.conftest import Objects, bucket

WRITERS = 32


def test_mixed_fresh_and_stale_writers_never_leave_a_stale_version(objects: Objects):
    o, b = objects, bucket()
    path = f"/v1/objects/{b}/state.bin"
    fences = [1 + i % 8 for i in range(WRITERS)]
    random.Random(7).shuffle(fences)
    blobs_before = len(o.blobs())
    barrier = threading.Barrier(WRITERS + 1)
    answers: list[tuple[int, int, httpx.Response]] = []
    seen: list[int] = []
    done = threading.Event()

    def write(index: int, fence: int) -> None:
        body = f"writer {index} fence {fence}\n".encode() * 2000
        with httpx.Client(base_url=o.url, timeout=30) as client:
            barrier.wait()
            answers.append((index, fence, client.put(path, content=body, headers=o.auth(b, fence))))

    def read() -> None:
        with httpx.Client(base_url=o.url, timeout=30) as client:
            barrier.wait()
            while not done.is_set():
                r = client.get(path)
                if r.status_code == 200:
                    seen.append(int(r.headers["x-object-fence"]))
                    fence = int(r.headers["x-object-fence"])
                    assert r.content.startswith(b"writer ") and f"fence {fence}\n".encode() in r.content

    threads = [threading.Thread(target=write, args=(i, f)) for i, f in enumerate(fences)]
    reader = threading.Thread(target=read)
    for thread in [*threads, reader]:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    reader.join()

    assert len(answers) == WRITERS
    ok = [(i, f) for i, f, r in answers if r.status_code in (200, 201)]
    refused = [r.json() for _, _, r in answers if r.status_code == 409]
    assert len(ok) + len(refused) == WRITERS, [r.text for _, _, r in answers]
    assert all(p["code"] == "stale_token" and p["presented"] < p["highest"] for p in refused)
    top = max(fences)
    final = o.client.get(path)
    assert int(final.headers["x-object-fence"]) == top
    winners = {i for i, f in ok if f == top}
    assert any(final.content == f"writer {i} fence {top}\n".encode() * 2000 for i in winners)
    assert seen == sorted(seen), "a reader saw the visible fence go down"
    assert o.client.get(f"/v1/fences/{b}").json()["highest"] == top
    assert len(o.blobs()) == blobs_before + 1, "stale and replaced blobs are all deleted"
