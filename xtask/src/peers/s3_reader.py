"""Reads objects straight from S3 for `cargo xtask bench peers`, the way a training job
without a cache would: boto3 with a thread pool, or AWS's s3torchconnector.

Usage: s3_reader.py FILE where FILE is JSON with endpoint, bucket, keys, threads, client
("boto3" | "s3torchconnector") and mode ("files": each key read whole by the next free
thread; "seq": one key streamed in 1 MiB reads). Prints one JSON line: files, bytes, secs,
p99_ms, errors, cpu_s, maxrss_kb.
"""
import json
import os
import resource
import sys
import threading
import time

CHUNK = 1 << 20


def boto3_client(cfg):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=cfg["endpoint"],
        region_name="us-east-1",
        aws_access_key_id=cfg["access_key"],
        aws_secret_access_key=cfg["secret_key"],
        config=Config(max_pool_connections=cfg["threads"] * 2, s3={"addressing_style": "path"}),
    )


def torch_dataset(cfg):
    # The public entry point training code uses: a map-style dataset over object URIs whose
    # items are lazy S3Readers.
    from s3torchconnector import S3ClientConfig, S3MapDataset

    os.environ["AWS_ACCESS_KEY_ID"] = cfg["access_key"]
    os.environ["AWS_SECRET_ACCESS_KEY"] = cfg["secret_key"]
    uris = ["s3://%s/%s" % (cfg["bucket"], k) for k in cfg["keys"]]
    return S3MapDataset.from_objects(
        uris,
        region="us-east-1",
        endpoint=cfg["endpoint"],
        s3client_config=S3ClientConfig(force_path_style=True),
    )


def opener(cfg):
    """A function key -> iterator of byte chunks, for the chosen client."""
    bucket = cfg["bucket"]
    if cfg["client"] == "boto3":
        client = boto3_client(cfg)

        def chunks(key):
            body = client.get_object(Bucket=bucket, Key=key)["Body"]
            while True:
                b = body.read(CHUNK)
                if not b:
                    return
                yield b

        return chunks
    dataset = torch_dataset(cfg)
    index = {k: i for i, k in enumerate(cfg["keys"])}

    def chunks(key):
        reader = dataset[index[key]]
        while True:
            b = reader.read(CHUNK)
            if not b:
                return
            yield b

    return chunks


def main():
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    chunks = opener(cfg)
    keys = cfg["keys"]
    lat, lock = [], threading.Lock()
    totals = {"bytes": 0, "errors": 0}
    nxt = iter(range(len(keys)))

    def worker():
        my_lat, my_bytes, my_err = [], 0, 0
        while True:
            with lock:
                i = next(nxt, None)
            if i is None:
                break
            if cfg["mode"] == "seq":
                # One stream, latency per 1 MiB read as a checkpoint loader sees it.
                t = time.perf_counter()
                try:
                    for b in chunks(keys[i]):
                        my_bytes += len(b)
                        now = time.perf_counter()
                        my_lat.append(now - t)
                        t = now
                except Exception:
                    my_err += 1
                continue
            t = time.perf_counter()
            try:
                for b in chunks(keys[i]):
                    my_bytes += len(b)
            except Exception:
                my_err += 1
            my_lat.append(time.perf_counter() - t)
        with lock:
            lat.extend(my_lat)
            totals["bytes"] += my_bytes
            totals["errors"] += my_err

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(cfg["threads"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    secs = time.perf_counter() - start
    lat.sort()
    p99 = lat[(len(lat) - 1) * 99 // 100] if lat else 0.0
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({
        "files": len(keys) if cfg["mode"] == "seq" else len(lat),
        "bytes": totals["bytes"],
        "secs": secs,
        "p99_ms": p99 * 1e3,
        "errors": totals["errors"],
        "cpu_s": ru.ru_utime + ru.ru_stime,
        "maxrss_kb": ru.ru_maxrss,
    }))


if __name__ == "__main__":
    main()
