#!/usr/bin/env python3
"""Object storage for the network tests' test "internet": run inside its
network namespace (never on a real network), beside inet.py.

Starts
  - moto (S3 and IAM with real SigV4 signature checks, through
    moto_server.py beside this file) over TLS on :9000 with the test
    certificate (the S3 endpoint https://s3.test:9000), and makes an IAM
    user with an access key and bucket `mount-data` holding
    `data/hello.txt`;
  - gcp-storage-emulator (Google Cloud Storage's JSON API, no auth of its
    own) on :9023, with bucket `mount-media` holding `dir/hello.txt`;
    inet.py serves it as https://storage.googleapis.com and checks the
    proxy's tokens.
Writes what the test needs to <dir>/buckets.json, prints READY, and stops
both servers when it is stopped.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

S3_PORT = 9000
GCS_PORT = 9023
S3_BUCKET = "mount-data"
GCS_BUCKET = "mount-media"

SETUP = r"""
import json, sys, boto3, urllib3
urllib3.disable_warnings()
url, ca = sys.argv[1], sys.argv[2]
kw = dict(endpoint_url=url, region_name="us-east-1", verify=ca)
iam = boto3.client("iam", aws_access_key_id="setup", aws_secret_access_key="setup", **kw)
iam.create_user(UserName="sandbox")
iam.put_user_policy(UserName="sandbox", PolicyName="all", PolicyDocument=json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
k = iam.create_access_key(UserName="sandbox")["AccessKey"]
# From here on every request is signed with the real key, and checked.
s3 = boto3.client("s3", aws_access_key_id=k["AccessKeyId"], aws_secret_access_key=k["SecretAccessKey"], **kw)
s3.create_bucket(Bucket=sys.argv[3])
s3.put_object(Bucket=sys.argv[3], Key="data/hello.txt", Body=b"hi from moto\n")
print(json.dumps({"key_id": k["AccessKeyId"], "secret": k["SecretAccessKey"]}))
"""


def wait_listening(port, what, child):
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if child.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"{what} did not start")
            time.sleep(0.1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--ca", required=True)
    p.add_argument("--ip", required=True, help="this namespace's address (in the certificate)")
    args = p.parse_args()

    moto = shutil.which("moto_server")
    emulator = shutil.which("gcp-storage-emulator")
    if not moto or not emulator:
        sys.exit("buckets.py needs moto_server and gcp-storage-emulator (scripts/install-deps)")
    # A Python with moto (and boto3): its launcher's, install-deps' venv,
    # or this one.
    with open(moto, errors="replace") as f:
        first = f.readline()[2:].strip()
    python = next(
        (py for py in (first, "/opt/hearth-test/moto/bin/python", sys.executable)
         if os.path.isabs(py) and " " not in py
         and subprocess.run([py, "-c", "import moto, boto3"], capture_output=True).returncode == 0),
        None)
    if python is None:
        sys.exit("no Python here has moto and boto3")
    here = os.path.dirname(os.path.abspath(__file__))
    log = open(os.path.join(args.dir, "buckets.log"), "ab")
    children = []
    # The set-up's three IAM requests go unsigned; every later one must
    # carry a valid signature from a real key.
    # Requests to s3.test:9000 name their bucket in the path (moto takes an
    # unknown host's first label for a bucket name otherwise).
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3",
           "MOTO_S3_CUSTOM_ENDPOINTS": f"https://s3.test:{S3_PORT}"}
    s3 = subprocess.Popen(
        [python, os.path.join(here, "moto_server.py"), "-H", "0.0.0.0", "-p", str(S3_PORT),
         "-s", "-c", args.cert, "-k", args.key],
        env=env, stdout=log, stderr=log)
    children.append(s3)
    gcs = subprocess.Popen(
        [emulator, "start", "--host", "0.0.0.0", "--port", str(GCS_PORT), "--in-memory"],
        stdout=log, stderr=log)
    children.append(gcs)

    def stop(*_):
        for c in children:
            c.terminate()
        for c in children:
            c.wait()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    wait_listening(S3_PORT, "moto", s3)
    wait_listening(GCS_PORT, "gcp-storage-emulator", gcs)
    out = subprocess.run(
        [python, "-c", SETUP, f"https://{args.ip}:{S3_PORT}", args.ca, S3_BUCKET],
        capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"moto set-up failed: {out.stderr}")
    keys = json.loads(out.stdout)

    gcs_url = f"http://127.0.0.1:{GCS_PORT}"

    def post(url, body, ctype):
        req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": ctype})
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()

    post(f"{gcs_url}/storage/v1/b?project=hearth", json.dumps({"name": GCS_BUCKET}).encode(), "application/json")
    post(f"{gcs_url}/upload/storage/v1/b/{GCS_BUCKET}/o?uploadType=media&name=dir/hello.txt",
         b"hi from gcs\n", "text/plain")

    with open(os.path.join(args.dir, "buckets.json"), "w") as f:
        json.dump({
            "s3": {"port": S3_PORT, "bucket": S3_BUCKET, "python": python, **keys},
            "gcs": {"port": GCS_PORT, "bucket": GCS_BUCKET},
        }, f)
    print("READY", flush=True)
    signal.pause()


if __name__ == "__main__":
    main()
