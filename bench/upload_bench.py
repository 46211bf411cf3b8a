"""The body of bench/upload.sh (see there): ckptd upload against aws-cli, curl
and rclone, to s3rver and nginx WebDAV, one large file and a folder of many
medium files. Prints one line per (server, data, tool), with the tool's CPU
time and how busy the server's main thread was, and the ratio to the fastest
peer."""
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.environ["CKPTD_BENCH_LIB"])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procstat import cpu_seconds  # noqa: E402
from same_start import same_start  # noqa: E402
from servers import FlakyProxy, Nginx, RgwServer, S3Server  # noqa: E402

ckptd = os.environ["CKPTD_BENCH_BIN"]
work = os.environ["CKPTD_BENCH_WORK"]
file_size = int(os.environ["CKPTD_BENCH_FILE_MIB"]) << 20
nfiles = int(os.environ["CKPTD_BENCH_FILES"])
files_size = int(os.environ["CKPTD_BENCH_FILES_MIB"]) << 20
MB = 1e6
seq = [0]
rclone = shutil.which("rclone")
# CKPTD_BENCH_ONLY=s3, =rgw, =webdav or =latency runs one part (bench/upload.sh's usage)
only = os.environ.get("CKPTD_BENCH_ONLY", "")
# rounds of every tool, alternating (this VM's speed moves with the host by
# up to 2x within the hour)
rounds = int(os.environ.get("CKPTD_BENCH_ROUNDS", "5"))


def make(path, n):
    block = os.urandom(8 << 20)  # incompressible, like float weights
    with open(path, "wb") as f:
        for off in range(0, n, len(block)):
            f.write(block[: min(len(block), n - off)])


def vmhwm(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


server_pids = []  # the running server's main threads (s3rver's node, nginx's worker)
server_whole = [False]  # True: every thread of server_pids counts (RGW's processes)


def main_thread_cpu():
    """CPU seconds (user + system) of the server's main threads so far: the
    one thread that parses every request (s3rver's event loop, nginx's single
    worker). Busy for the whole of a run, it sets the pace for every client.
    RGW has no such thread (radosgw and the OSD each run many): for it, every
    thread of both processes, so its share can pass 100% (cores)."""
    total = 0
    for pid in server_pids:
        try:
            total += cpu_seconds(pid) if server_whole[0] else cpu_seconds(pid, tid=pid)
        except OSError:
            pass
    return total


def timed(cmd, env):
    """wall seconds, peak RSS (KiB), the tool's CPU seconds and the server's
    main-thread CPU seconds over the run; fails loudly on a non-zero exit.
    The peak is VmHWM sampled every 20 ms: rusage's ru_maxrss would count the
    memory of this Python process, which the child shares until its exec."""
    with tempfile.TemporaryFile() as errf:
        s0 = main_thread_cpu()
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=errf)
        peak = 0
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)  # reaped here: its rusage
            if pid:
                break
            peak = max(peak, vmhwm(p.pid))
            time.sleep(0.02)
        t = time.perf_counter() - t0
        server = main_thread_cpu() - s0
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            errf.seek(0)
            sys.exit(f"bench: {' '.join(cmd[:4])}... failed:\n"
                     f"{errf.read().decode(errors='replace')[-2000:]}")
    return t, peak, ru.ru_utime + ru.ru_stime, server


def best(tools, clean, src):
    """`rounds` rounds per tool, alternating; clean() after every run frees the
    disk, and each run starts from the same state (same_start.py). Per tool:
    every wall time and the peak RSS."""
    out = {}
    for _ in range(rounds):
        for name, fn in tools:
            seq[0] += 1
            same_start(work, [src])
            t, rss, cpu, server = fn(f"r{seq[0]}")
            clean()
            times, peak, cpus, busy = out.get(name, ([], 0, [], []))
            out[name] = (times + [t], max(rss, peak), cpus + [cpu], busy + [server / t])
    return out


def median(ts):
    s = sorted(ts)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def report(server, what, size, res, busy="server's main thread busy"):
    """Each tool's best and median; the ratios to the fastest peer by both.
    The best of several peers is the minimum of more runs than ckptd's best
    (two peers: twice as many), so on a noisy machine it favours the peers
    even when all run at the server's speed; the median has no such bias."""
    for name, (ts, rss, cpus, share) in res.items():
        print(f"{server:7} {what:22} {name:7} best {min(ts):6.2f} s median {median(ts):6.2f} s "
              f"{size / MB / min(ts):5.0f} MB/s peak RSS {rss / 1024:6.1f} MiB; CPU {median(cpus):5.2f} s, "
              f"{busy} {100 * median(share):3.0f}% (medians)")
    peers = {k: v[0] for k, v in res.items() if k != "ckptd"}
    c = res["ckptd"][0]
    fb = min(peers, key=lambda k: min(peers[k]))
    fm = min(peers, key=lambda k: median(peers[k]))
    print(f"{server:7} {what:22} ratio vs fastest peer: medians {median(peers[fm]) / median(c):.2f}x "
          f"({fm}), bests {min(peers[fb]) / min(c):.2f}x ({fb})")


def ckptd_up(src, dest, env, extra=()):
    def run(tag):
        state = os.path.join(work, "state-" + tag)  # a fresh queue: nothing skipped as sent
        r = timed([ckptd, "upload", "-q", "--no-progress", "--state", state, *extra, src,
                   f"{dest}/{tag}/"], env)  # a prefix: the file keeps its name
        shutil.rmtree(state, ignore_errors=True)
        return r
    return run


big = os.path.join(work, "epoch_1.bin")
folder = os.path.join(work, "shards")
make(big, file_size)
os.makedirs(folder)
for i in range(nfiles):
    make(os.path.join(folder, f"model-{i + 1:05d}-of-{nfiles:05d}.safetensors"), files_size)
data = [("file", big, file_size, f"1 file of {file_size >> 20} MiB"),
        ("folder", folder, nfiles * files_size, f"{nfiles} files of {files_size >> 20} MiB")]
print(f"{rounds} runs each, tools alternating, data page-cached; rclone: "
      f"{'yes' if rclone else 'absent (skipped)'}")


def wipe(path):
    def clean():
        for p in glob.glob(os.path.join(path, "*")):
            shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else os.remove(p)
    return clean


def rclone_s3_env(env, s3, endpoint):
    """rclone's remote "s3:" for the test server at endpoint, from the environment."""
    renv = dict(env, RCLONE_CONFIG_S3_TYPE="s3", RCLONE_CONFIG_S3_PROVIDER="Other",
                RCLONE_CONFIG_S3_ACCESS_KEY_ID=s3.key_id,
                RCLONE_CONFIG_S3_SECRET_ACCESS_KEY=s3.secret,
                RCLONE_CONFIG_S3_ENDPOINT=endpoint, RCLONE_CONFIG_S3_FORCE_PATH_STYLE="true",
                RCLONE_CONFIG_S3_NO_CHECK_BUCKET="true")
    # rclone's AWS SDK refuses a CA bundle with its own HTTP transport; loopback is plain http
    renv.pop("AWS_CA_BUNDLE", None)
    return renv


def s3_tools(kind, src, bucket, endpoint, env, renv):
    """ckptd, aws-cli and (when installed) rclone sending src to an S3
    server's bucket: a file under each run's tag, a folder as that prefix."""
    rec = ["--recursive"] if kind == "folder" else []
    tools = [("ckptd", ckptd_up(src, f"s3://{bucket}", env, ("--endpoint", endpoint))),
             ("aws", lambda tag: timed(["aws", "--endpoint-url", endpoint, "s3", "cp",
                                        "--no-progress", "--only-show-errors", *rec, src,
                                        f"s3://{bucket}/{tag}/" + ("" if rec else "x.bin")], env))]
    if rclone:
        tools.append(("rclone", lambda tag: timed([rclone, "copy", "-q", src,
                                                   f"s3:{bucket}/{tag}"], renv)))
    return tools


def bench_s3():
    with S3Server(work) as s3:
        server_pids[:] = [s3.proc.pid]
        env = dict(os.environ, **s3.env())
        renv = rclone_s3_env(env, s3, s3.endpoint)
        for kind, src, size, what in data:
            tools = s3_tools(kind, src, "ckpt", s3.endpoint, env, renv)
            report("s3rver", what, size, best(tools, wipe(os.path.join(s3.dir, "ckpt")), src))


def bench_rgw():
    """The same data to Ceph's RADOS Gateway (tests/lib/rgw.sh: mon, mgr, one
    memstore OSD, radosgw on loopback), a production S3 server, started here
    for the bench with a RAM store big enough for the largest object. Its
    busy share is radosgw's and the OSD's CPU over the run (all threads)."""
    if not shutil.which("radosgw"):
        print("rgw     skipped: radosgw is not installed (apt-get install radosgw ceph-mon ceph-osd "
              "ceph-mgr ceph-common uuid-runtime)")
        return
    d = os.path.join(work, "rgw")
    largest = max(file_size, nfiles * files_size)
    env = dict(os.environ, CK_RGW_MEMSTORE_BYTES=str(largest + (1 << 30)))
    subprocess.run([os.path.join(os.environ["CKPTD_BENCH_LIB"], "rgw.sh"), "start", d],
                   env=env, check=True, stdout=subprocess.DEVNULL)
    try:
        os.environ["CK_RGW_DIR"] = d
        rgw = RgwServer(work)
        with open(os.path.join(d, "pids")) as f:
            pids = dict(line.split() for line in f)
        server_pids[:] = [int(v) for k, v in pids.items() if k.startswith(("rgw.", "osd."))]
        server_whole[0] = True
        env = dict(os.environ, **rgw.env())
        renv = rclone_s3_env(env, rgw, rgw.endpoint)
        conf = os.path.join(d, "ceph.conf")

        def clean():
            # deleted objects' tails wait for RGW's garbage collector (hours by
            # default): collect them now, or the RAM store fills up
            rgw.aws("s3", "rm", "--quiet", "--recursive", f"s3://{rgw.bucket}/")
            subprocess.run(["radosgw-admin", "-c", conf, "gc", "process", "--include-all"],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        b = rgw.bucket
        for kind, src, size, what in data:
            tools = s3_tools(kind, src, b, rgw.endpoint, env, renv)
            report("rgw", what, size, best(tools, clean, src), busy="RGW+OSD busy (all threads)")
    finally:
        server_whole[0] = False
        server_pids[:] = []
        subprocess.run([os.path.join(os.environ["CKPTD_BENCH_LIB"], "rgw.sh"), "stop", d])


def bench_webdav():
    with Nginx(work) as web:
        # its one worker (worker_processes 1), the master's child
        with open(f"/proc/{web.proc.pid}/task/{web.proc.pid}/children") as f:
            server_pids[:] = [int(x) for x in f.read().split()]
        env = dict(os.environ)
        renv = dict(env, RCLONE_CONFIG_DAV_TYPE="webdav", RCLONE_CONFIG_DAV_URL=web.url,
                    RCLONE_CONFIG_DAV_VENDOR="other")

        def curl(src, kind):
            def run(tag):
                if kind == "file":
                    return timed(["curl", "-sSf", "-T", src, f"{web.url}/{tag}/x.bin"], env)
                names = ",".join(sorted(os.listdir(src)))
                # curl's own parallel transfers, 4 like the others' defaults
                return timed(["curl", "-sSf", "--parallel", "--parallel-max", "4", "-T",
                              f"{src}/{{{names}}}", f"{web.url}/{tag}/"], env)
            return run

        for kind, src, size, what in data:
            tools = [("ckptd", ckptd_up(src, web.url, env)), ("curl", curl(src, kind))]
            if rclone:
                tools.append(("rclone", lambda tag: timed([rclone, "copy", "-q", src, f"dav:{tag}"],
                                                          renv)))
            report("nginx", what, size, best(tools, wipe(web.root), src))


def bench_s3_latency():
    """Many small files to s3rver through a proxy that adds a round trip
    (CKPTD_BENCH_RTT_MS, default 50) to every request, as a far region or a
    slow link would: the per-file requests around the body (HEAD, MOVE,
    CompleteMultipartUpload) weigh there, not on loopback."""
    rtt = float(os.environ.get("CKPTD_BENCH_RTT_MS", "50")) / 1000
    n, size = 32, 1 << 20
    small = os.path.join(work, "small")
    os.makedirs(small, exist_ok=True)
    for i in range(n):
        make(os.path.join(small, f"f{i:02d}.bin"), size)
    with S3Server(work) as s3, FlakyProxy(s3.port, [], gate=lambda *a: time.sleep(rtt)) as px:
        server_pids[:] = [s3.proc.pid]
        env = dict(os.environ, **s3.env())
        renv = rclone_s3_env(env, s3, px.url)
        tools = [("ckptd", ckptd_up(small, "s3://ckpt", env, ("--endpoint", px.url))),
                 ("aws", lambda tag: timed(["aws", "--endpoint-url", px.url, "s3", "cp",
                                            "--no-progress", "--only-show-errors", "--recursive",
                                            small, f"s3://ckpt/{tag}/"], env))]
        if rclone:
            tools.append(("rclone", lambda tag: timed([rclone, "copy", "-q", small, f"s3:ckpt/{tag}"],
                                                      renv)))
        report(f"s3+{rtt * 1000:.0f}ms", f"{n} files of {size >> 20} MiB", n * size,
               best(tools, wipe(os.path.join(s3.dir, "ckpt")), small))


if only in ("", "s3"):
    bench_s3()
if only in ("", "rgw"):
    bench_rgw()
if only in ("", "webdav"):
    bench_webdav()
if only in ("", "latency"):
    bench_s3_latency()
