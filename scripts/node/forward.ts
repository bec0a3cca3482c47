/**
 * The test node's one way in from the host: the holder listens on a Unix socket in the node's
 * folder (the host can reach that file, not an address inside the namespace); each connection
 * starts with one line naming an address inside (`10.244.0.5:8080\n`), and the holder joins the
 * rest of it to a connection to that address. The host side is a 127.0.0.1 listener per target
 * that writes that line, so a test, kubectl or a browser only see a loopback port.
 */
import { createConnection, createServer, isIPv4, type Server, type Socket } from 'node:net';

/** An address inside the node. */
export interface Target {
  host: string;
  port: number;
}

/** The longest first line the holder reads (an IPv4 address, a colon, a port, a newline). */
const MAX_HEADER = 32;

/** How long the holder waits for a connection's first line, in ms. */
const HEADER_TIMEOUT_MS = 5_000;

/** Parses a connection's first line (without its newline). Pure. @returns undefined unless `IPv4:port`. */
export function parseTarget(line: string): Target | undefined {
  const m = /^(\d{1,3}(?:\.\d{1,3}){3}):(\d{1,5})$/.exec(line);
  if (!m || !isIPv4(m[1]!)) return undefined;
  const port = Number(m[2]);
  return port >= 1 && port <= 65535 ? { host: m[1]!, port } : undefined;
}

/**
 * Joins two sockets (both made with `allowHalfOpen`, so a client that ends its side after
 * its request still gets the whole reply); an error on either side, or either one closing,
 * ends both.
 */
function join(a: Socket, b: Socket): void {
  a.pipe(b).pipe(a);
  const close = () => {
    a.destroy();
    b.destroy();
  };
  a.on('error', close);
  b.on('error', close);
  a.on('close', close);
  b.on('close', close);
}

/**
 * The host's side: a server (not listening yet) whose every connection is carried through the
 * holder's socket `socket` to `target` inside the node.
 */
export function hostForward(socket: string, target: Target): Server {
  return createServer({ allowHalfOpen: true }, (inbound) => {
    const outbound = createConnection({ path: socket, allowHalfOpen: true });
    outbound.write(`${target.host}:${target.port}\n`);
    join(inbound, outbound);
  });
}

/**
 * The holder's side: a server (not listening yet) that reads each connection's first line,
 * connects to the address it names and joins the two. A line that names no `IPv4:port` within
 * {@link MAX_HEADER} bytes, or none within {@link HEADER_TIMEOUT_MS}, closes the connection.
 */
export function holderForward(): Server {
  return createServer({ allowHalfOpen: true }, (inbound) => {
    inbound.setTimeout(HEADER_TIMEOUT_MS, () => inbound.destroy());
    let head = Buffer.alloc(0);
    const onData = (chunk: Buffer) => {
      head = Buffer.concat([head, chunk]);
      const nl = head.indexOf(10);
      if (nl < 0) {
        if (head.length > MAX_HEADER) inbound.destroy();
        return;
      }
      inbound.off('data', onData);
      inbound.pause();
      inbound.setTimeout(0);
      const target = parseTarget(head.subarray(0, nl).toString('latin1'));
      if (!target) return void inbound.destroy();
      const outbound = createConnection({ ...target, allowHalfOpen: true });
      const rest = head.subarray(nl + 1);
      if (rest.length) outbound.write(rest);
      join(inbound, outbound);
      inbound.resume();
    };
    inbound.on('data', onData);
    inbound.on('error', () => inbound.destroy());
  });
}
