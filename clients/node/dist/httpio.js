/** The whole body of req: null when it is over `limit` bytes (Content-Length says so, or the bytes do),
 *  undefined when the client went away. The bytes are put back into the stream (unshift, before its end
 *  is emitted), so that whoever reads it next reads them all. */
export function readBody(req, limit) {
    if (Number(req.headers["content-length"]) > limit)
        return Promise.resolve(null);
    if (req.complete && req.readableLength === 0)
        return Promise.resolve(Buffer.alloc(0));
    return new Promise((resolve) => {
        const chunks = [];
        let size = 0;
        const finish = (v) => {
            req.off("readable", onReadable);
            req.off("error", gone);
            req.off("close", gone);
            resolve(v);
        };
        const gone = () => finish(undefined);
        function onReadable() {
            let chunk;
            while ((chunk = req.read()) !== null) {
                size += chunk.length;
                if (size > limit)
                    return finish(null);
                chunks.push(chunk);
            }
            if (req.complete) {
                const body = Buffer.concat(chunks);
                if (body.length > 0)
                    req.unshift(body);
                finish(body);
            }
        }
        req.on("readable", onReadable);
        req.once("error", gone);
        req.once("close", gone);
    });
}
/** Sends a whole response (replays and problems). */
export function send(res, status, headers, body) {
    const byName = new Map();
    for (const [k, v] of headers)
        byName.set(k, [...(byName.get(k) ?? []), v]);
    res.statusCode = status;
    for (const [k, v] of byName)
        res.setHeader(k, v.length === 1 ? v[0] : v);
    res.setHeader("content-length", body.length);
    res.end(body);
}
function toBuffer(chunk, encoding) {
    if (Buffer.isBuffer(chunk))
        return chunk;
    if (typeof chunk === "string")
        return Buffer.from(chunk, encoding ?? "utf8");
    return Buffer.from(chunk);
}
/** Keeps what the handler writes to res (status, headers, body) instead of sending it. */
export function captureResponse(res) {
    const own = { writeHead: res.writeHead, write: res.write, end: res.end, flushHeaders: res.flushHeaders };
    const chunks = [];
    let ended;
    let endCallback;
    const done = new Promise((resolve) => { ended = resolve; });
    const closed = () => ended("closed");
    const r = res;
    r.writeHead = (status, ...rest) => {
        res.statusCode = status;
        if (typeof rest[0] === "string")
            res.statusMessage = rest.shift();
        const h = rest[0];
        if (Array.isArray(h)) {
            const pairs = Array.isArray(h[0]) ? h : h.flatMap((x, i) => (i % 2 ? [] : [[x, h[i + 1]]]));
            for (const [k, v] of pairs)
                res.appendHeader(k, v);
        }
        else if (h) {
            for (const [k, v] of Object.entries(h))
                res.setHeader(k, v);
        }
        return res;
    };
    r.write = (chunk, encoding, cb) => {
        if (typeof encoding === "function")
            [cb, encoding] = [encoding, undefined];
        if (chunk != null)
            chunks.push(toBuffer(chunk, encoding));
        if (cb)
            process.nextTick(cb);
        return true;
    };
    r.end = (chunk, encoding, cb) => {
        if (typeof chunk === "function")
            [cb, chunk] = [chunk, undefined];
        if (typeof encoding === "function")
            [cb, encoding] = [encoding, undefined];
        if (chunk != null)
            chunks.push(toBuffer(chunk, encoding));
        endCallback = cb;
        ended("ended");
        return res;
    };
    r.flushHeaders = () => { };
    res.once("close", closed);
    const restore = () => {
        Object.assign(r, own);
        res.off("close", closed);
    };
    return {
        done,
        body: () => Buffer.concat(chunks),
        restore,
        flush() {
            restore();
            res.end(Buffer.concat(chunks), endCallback);
        },
        discard() {
            restore();
            for (const name of res.getHeaderNames())
                res.removeHeader(name);
        },
        fail() {
            this.discard();
            send(res, 500, [["content-type", "text/plain; charset=utf-8"]], Buffer.from("Internal Server Error"));
        },
    };
}
