/**
 * Watching TCP connections: a process's connections to one port, counted from /proc (Linux:
 * the socket inodes of `/proc/<pid>/fd` matched against `/proc/<pid>/net/tcp` and `tcp6`);
 * and a tap, a byte-for-byte TCP relay in front of an HTTP/1.1 server that records each
 * connection's exchanges without changing them (one upstream connection per client
 * connection, closed when the other side closes), so a test sees what a client such as
 * Knative's Broker filter saw: answers, their `Connection` header, requests cut off.
 */
import { readFileSync, readdirSync, readlinkSync } from 'node:fs';
import { connect, createServer, type Socket } from 'node:net';

function socketInodes(pid: number): Set<string> {
  const out = new Set<string>();
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`));
      if (m) out.add(m[1]!);
    } catch {
      // closed meanwhile
    }
  }
  return out;
}

/**
 * Established or opening connections of process `pid` whose remote port is `port`.
 * @returns 0 when the process is gone.
 */
export function connectionsTo(pid: number, port: number): number {
  let inodes: Set<string>;
  try {
    inodes = socketInodes(pid);
  } catch {
    return 0;
  }
  const hexPort = port.toString(16).toUpperCase().padStart(4, '0');
  let n = 0;
  for (const table of ['tcp', 'tcp6']) {
    let text: string;
    try {
      text = readFileSync(`/proc/${pid}/net/${table}`, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      const f = line.trim().split(/\s+/);
      // f[2] = remote address:port, f[3] = state (0A = LISTEN), f[9] = inode
      if (f.length < 10 || f[3] === '0A') continue;
      if (f[2]!.endsWith(`:${hexPort}`) && inodes.has(f[9]!)) n++;
    }
  }
  return n;
}

/** One client connection through a {@link Tap}. */
export interface TappedConnection {
  /** When each request began reaching the server (`Date.now()` of its first byte). */
  requests: number[];
  /** Each answer's status line and headers, lower-cased. */
  answers: string[];
  /** The server closed the connection while a request on it had no answer yet. */
  cut: boolean;
  /** The server refused the connection (nothing reached it). */
  refused: boolean;
  /** A request on it waits for its answer. */
  pending: boolean;
  /** Which side closed it first, once closed. */
  closed?: 'server' | 'client';
}

/** A running tap. */
export interface Tap {
  /** `http://127.0.0.1:<port>`: give clients this instead of the server's address. */
  url: string;
  connections: TappedConnection[];
  /** The start (`Date.now()`) of the oldest request the server is answering, if any. */
  oldestPending(): number | undefined;
  close(): Promise<void>;
}

/** Relays one client connection to `port`, recording into `c`. */
function relay(client: Socket, port: number, c: TappedConnection): void {
  const server = connect(port, '127.0.0.1');
  let connected = false;
  let clientGone = false;
  let head = '';
  server.once('connect', () => (connected = true));
  client.on('data', (d: Buffer) => {
    if (!c.pending) c.requests.push(Date.now());
    c.pending = true;
    head = '';
    server.write(d);
  });
  server.on('data', (d: Buffer) => {
    if (c.pending) {
      head += d.toString('latin1');
      const end = head.indexOf('\r\n\r\n');
      if (end >= 0) {
        c.answers.push(head.slice(0, end).toLowerCase());
        c.pending = false;
      }
    }
    client.write(d);
  });
  server.on('close', () => {
    c.closed ??= 'server';
    if (!connected) c.refused = true;
    else if (c.pending && !clientGone) c.cut = true;
    c.pending = false;
    client.destroy();
  });
  server.on('error', () => {});
  client.on('error', () => {});
  client.on('close', () => {
    c.closed ??= 'client';
    clientGone = true;
    server.destroy();
  });
}

/**
 * Starts a tap in front of the HTTP/1.1 server on loopback `port`.
 * @returns the tap; its connections fill as clients come.
 */
export async function startTap(port: number): Promise<Tap> {
  const connections: TappedConnection[] = [];
  const sockets = new Set<Socket>();
  const tap = createServer((client) => {
    const c: TappedConnection = { requests: [], answers: [], cut: false, refused: false, pending: false };
    connections.push(c);
    sockets.add(client);
    client.on('close', () => sockets.delete(client));
    relay(client, port, c);
  });
  await new Promise<void>((r) => tap.listen(0, '127.0.0.1', () => r()));
  return {
    url: `http://127.0.0.1:${(tap.address() as { port: number }).port}`,
    connections,
    oldestPending: () => {
      const starts = connections.filter((c) => c.pending).map((c) => c.requests.at(-1)!);
      return starts.length ? Math.min(...starts) : undefined;
    },
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        tap.close(() => r());
      }),
  };
}
