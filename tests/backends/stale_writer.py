"""A worker that is paused between taking its token and writing: the stale writer.

Usage: ``python3 stale_writer.py SPEC.json``. The spec names the election nodes
(``nodes``), the write to make and where to put the outcome (``result``). The writer
asks the nodes for the established leader's token, writes it to ``RESULT.token``, then
stops itself with SIGSTOP, exactly as a process frozen by a garbage-collection pause
right before its write. Once continued (SIGCONT), it makes the write with the token it
took and writes ``{"status": N, "token": T}`` to ``RESULT``.

Writes (``kind``):
- ``http``: ``method``, ``url``, ``body``, ``headers``; ``Fencing-Token`` is added.
- ``s3``: ``endpoint``, ``bucket``, ``key``, ``body``, ``access_key``, ``secret_key``:
  a boto3 ``put_object`` whose ``Fencing-Token`` header is added before signing, so it is
  part of the SigV4 signature.
"""

import json
import os
import signal
import sys
import urllib.error
import urllib.request


def leader_token(nodes):
    for url in nodes:
        try:
            with urllib.request.urlopen(url + "/v1/leader", timeout=5) as answer:
                view = json.load(answer)
        except OSError:
            continue
        if view.get("token") is not None:
            return view["token"]
    raise SystemExit("no node holds a token")


def write_http(spec, token):
    request = urllib.request.Request(
        spec["url"],
        data=spec["body"].encode(),
        method=spec["method"],
        headers={**spec.get("headers", {}), "Fencing-Token": str(token)},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as e:
        return e.code


def write_s3(spec, token):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from s3 import s3_client  # noqa: PLC0415 - only this kind needs boto3

    client = s3_client(spec["endpoint"], spec["access_key"], spec["secret_key"], lambda: token)
    from botocore.exceptions import ClientError  # noqa: PLC0415

    try:
        answer = client.put_object(Bucket=spec["bucket"], Key=spec["key"], Body=spec["body"].encode())
        return answer["ResponseMetadata"]["HTTPStatusCode"]
    except ClientError as e:
        return e.response["ResponseMetadata"]["HTTPStatusCode"]


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    token = leader_token(spec["nodes"])
    with open(spec["result"] + ".token", "w") as f:
        json.dump({"token": token}, f)
    # The pause: from here the process does nothing until the test continues it.
    os.kill(os.getpid(), signal.SIGSTOP)
    status = write_s3(spec, token) if spec["kind"] == "s3" else write_http(spec, token)
    with open(spec["result"], "w") as f:
        json.dump({"status": status, "token": token}, f)


if __name__ == "__main__":
    main()
