// The HTTP middleware's I/O (http.ts): the request body read whole and handed back to the stream for the
// parsers after it (express.json() & co.), and the response kept until its transaction is settled.
import type { IncomingMessage, ServerResponse } from "node:http";

/** The whole body of req: null when it is over `limit` bytes (Content-Length says so, or the bytes do),
 *  undefined when the client went away. The bytes are put back into the stream (unshift, before its end
 *  is emitted), so that whoever reads it next reads them all. */
export function readBody(req: IncomingMessage, limit: number): Promise<Buffer | null | undefined> {
  if (Number(req.headers["content-length"]) > limit) return Promise.resolve(null);
  if (req.complete && req.readableLength === 0) return Promise.resolve(Buffer.alloc(0));
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const finish = (v: Buffer | null | undefined) => {
      req.off("readable", onReadable);
      req.off("error", gone);
      req.off("close", gone);
      resolve(v);
    };
    const gone = () => finish(undefined);
    function onReadable() {
      let chunk: Buffer | null;
      while ((chunk = req.read()) !== null) {
        size += chunk.length;
        if (size > limit) return finish(null);
        chunks.push(chunk);
      }
      if (req.complete) {
        const body = Buffer.concat(chunks);
        if (body.length > 0) req.unshift(body);
        finish(body);
      }
    }
    req.on("readable", onReadable);
    req.once("error", gone);
    req.once("close", gone);
  });
}

/** Sends a whole response (replays and problems). */
export function send(res: ServerResponse, status: number, headers: [string, string][], body: Buffer) {
  const byName = new Map<string, string[]>();
  for (const [k, v] of headers) byName.set(k, [...(byName.get(k) ?? []), v]);
  res.statusCode = status;
  for (const [k, v] of byName) res.setHeader(k, v.length === 1 ? v[0] : v);
  res.setHeader("content-length", body.length);
  res.end(body);
}

export interface Captured {
  /** "ended": the handler ended its response; "closed": the connection closed before */
  done: Promise<"ended" | "closed">;
  body(): Buffer;
  /** puts the response's own methods back */
  restore(): void;
  /** sends the kept response */
  flush(): void;
  /** forgets the kept response, the headers the handler set included (before an answer of the middleware's) */
  discard(): void;
  /** sends a bare 500 instead of the kept response */
  fail(): void;
}

type Callback = (err?: Error | null) => void;

function toBuffer(chunk: unknown, encoding?: BufferEncoding): Buffer {
  if (Buffer.isBuffer(chunk)) return chunk;
  if (typeof chunk === "string") return Buffer.from(chunk, encoding ?? "utf8");
  return Buffer.from(chunk as Uint8Array);
}

/** Keeps what the handler writes to res (status, headers, body) instead of sending it. */
export function captureResponse(res: ServerResponse): Captured {
  const own = { writeHead: res.writeHead, write: res.write, end: res.end, flushHeaders: res.flushHeaders };
  const chunks: Buffer[] = [];
  let ended!: (how: "ended" | "closed") => void;
  let endCallback: Callback | undefined;
  const done = new Promise<"ended" | "closed">((resolve) => { ended = resolve; });
  const closed = () => ended("closed");
  const r = res as unknown as Record<string, unknown>;
  r.writeHead = (status: number, ...rest: unknown[]) => {
    res.statusCode = status;
    if (typeof rest[0] === "string") res.statusMessage = rest.shift() as string;
    const h = rest[0];
    if (Array.isArray(h)) {
      const pairs = Array.isArray(h[0]) ? h : h.flatMap((x, i) => (i % 2 ? [] : [[x, h[i + 1]]]));
      for (const [k, v] of pairs as [string, string][]) res.appendHeader(k, v);
    } else if (h) {
      for (const [k, v] of Object.entries(h as Record<string, string | string[]>)) res.setHeader(k, v);
    }
    return res;
  };
  r.write = (chunk: unknown, encoding?: BufferEncoding | Callback, cb?: Callback) => {
    if (typeof encoding === "function") [cb, encoding] = [encoding, undefined];
    if (chunk != null) chunks.push(toBuffer(chunk, encoding));
    if (cb) process.nextTick(cb);
    return true;
  };
  r.end = (chunk?: unknown, encoding?: BufferEncoding | Callback, cb?: Callback) => {
    if (typeof chunk === "function") [cb, chunk] = [chunk as Callback, undefined];
    if (typeof encoding === "function") [cb, encoding] = [encoding, undefined];
    if (chunk != null) chunks.push(toBuffer(chunk, encoding));
    endCallback = cb;
    ended("ended");
    return res;
  };
  r.flushHeaders = () => {};
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
      res.end(Buffer.concat(chunks), endCallback as (() => void) | undefined);
    },
    discard() {
      restore();
      for (const name of res.getHeaderNames()) res.removeHeader(name);
    },
    fail() {
      this.discard();
      send(res, 500, [["content-type", "text/plain; charset=utf-8"]], Buffer.from("Internal Server Error"));
    },
  };
}
