import type { IncomingMessage, ServerResponse } from "node:http";
/** The whole body of req: null when it is over `limit` bytes (Content-Length says so, or the bytes do),
 *  undefined when the client went away. The bytes are put back into the stream (unshift, before its end
 *  is emitted), so that whoever reads it next reads them all. */
export declare function readBody(req: IncomingMessage, limit: number): Promise<Buffer | null | undefined>;
/** Sends a whole response (replays and problems). */
export declare function send(res: ServerResponse, status: number, headers: [string, string][], body: Buffer): void;
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
/** Keeps what the handler writes to res (status, headers, body) instead of sending it. */
export declare function captureResponse(res: ServerResponse): Captured;
