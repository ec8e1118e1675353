# The floods of tests/src/flood.rs, run from inside a Pod by the store image's python3 (the
# tenant's side of tests/tests/install/flood.rs). One mode a run; prints the tally as JSON:
#   slow   HOST PORT PATH CONNECTIONS BODY AT_ONCE EVERY HOLD
#   idle   HOST PORT CONNECTIONS HOLD
#   forged HOST PORT PATH WORKERS REQUESTS SECONDS REVIEW_JSON
# Every connection is bounded in time; the target is whatever address the test names.
import asyncio, json, ssl, sys, time

TLS = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
TLS.check_hostname = False
TLS.verify_mode = ssl.CERT_NONE  # the flood attacks the server, it does not authenticate it
TLS.set_alpn_protocols(["http/1.1"])
CHUNK = 65536
tally = {"opened": 0, "closed": 0, "refused": 0, "statuses": {}}


def answered(head):
    try:
        status = int(head.split(b"\r\n", 1)[0].split(b" ")[1])
    except (IndexError, ValueError):
        tally["closed"] += 1
        return
    tally["statuses"][str(status)] = tally["statuses"].get(str(status), 0) + 1


async def connect(host, port, tls):
    try:
        c = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=TLS if tls else None), 15)
    except (OSError, asyncio.TimeoutError, ssl.SSLError):
        tally["refused"] += 1
        return None
    tally["opened"] += 1
    return c


async def slow_one(host, port, head, start, body, every, deadline):
    c = await connect(host, port, True)
    if c is None:
        return
    r, w = c
    try:
        w.write(head)
        for i in range(0, len(start), CHUNK):
            w.write(start[i:i + CHUNK])
            await asyncio.wait_for(w.drain(), max(0.1, deadline - time.monotonic()))
        left = body - len(start)
        while time.monotonic() < deadline and left > 1:
            try:
                got = await asyncio.wait_for(r.read(256), every)
            except asyncio.TimeoutError:
                w.write(b"a")
                await asyncio.wait_for(w.drain(), max(0.1, deadline - time.monotonic()))
                left -= 1
                continue
            if got:
                answered(got)  # the server answered before the body was done
            else:
                tally["closed"] += 1
            return
    except asyncio.TimeoutError:
        pass  # held until the end: the server neither read nor closed
    except (OSError, ssl.SSLError, ConnectionError):
        tally["closed"] += 1
    finally:
        w.close()


async def idle_one(host, port, hold):
    c = await connect(host, port, False)
    if c is None:
        return
    r, w = c
    try:
        if await asyncio.wait_for(r.read(16), hold) == b"":
            tally["closed"] += 1
    except asyncio.TimeoutError:
        pass
    except (OSError, ConnectionError):
        tally["closed"] += 1
    finally:
        w.close()


async def forger(host, port, request, left, deadline):
    while left[0] > 0 and time.monotonic() < deadline:
        left[0] -= 1
        c = await connect(host, port, True)
        if c is None:
            continue
        r, w = c
        try:
            w.write(request)
            await w.drain()
            answer = await asyncio.wait_for(r.read(), 15)
            answered(answer) if answer else tally.__setitem__("closed", tally["closed"] + 1)
        except (asyncio.TimeoutError, OSError, ssl.SSLError, ConnectionError):
            tally["closed"] += 1
        finally:
            w.close()


async def main(mode, host, port, args):
    if mode == "slow":
        path, n, body, at_once, every, hold = args[0], int(args[1]), int(args[2]), int(args[3]), float(args[4]), float(args[5])
        head = ("POST %s HTTP/1.1\r\nhost: kvcache-operator\r\ncontent-type: application/json\r\n"
                "content-length: %d\r\n\r\n" % (path, body)).encode()
        start = b'"' + b"a" * (min(at_once, body) - 1)
        deadline = time.monotonic() + hold
        await asyncio.gather(*(slow_one(host, port, head, start, body, every, deadline) for _ in range(n)))
    elif mode == "idle":
        n, hold = int(args[0]), float(args[1])
        await asyncio.gather(*(idle_one(host, port, hold) for _ in range(n)))
    elif mode == "forged":
        path, workers, requests, seconds, review = args[0], int(args[1]), int(args[2]), float(args[3]), args[4].encode()
        request = ("POST %s HTTP/1.1\r\nhost: kvcache-operator\r\ncontent-type: application/json\r\n"
                   "content-length: %d\r\nconnection: close\r\n\r\n" % (path, len(review))).encode() + review
        left, deadline = [requests], time.monotonic() + seconds
        await asyncio.gather(*(forger(host, port, request, left, deadline) for _ in range(workers)))
    else:
        raise SystemExit("unknown mode %r" % mode)


asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]))
print(json.dumps(tally))
