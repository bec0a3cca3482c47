/**
 * Free TCP ports for the processes tests and tools start. Node built-ins only: the image's
 * build stage runs scripts/lib/warm-compile-cache.ts, which uses it.
 *
 * A port the OS hands out for `listen(0)` comes from the ephemeral range
 * (`net.ipv4.ip_local_port_range`), the same range every outgoing connection takes its local
 * port from. Between the check and the real bind, any connection made on the machine may take
 * it; under a full suite's load that happened (a Broker data plane's dispatcher found its port
 * taken). So a port is drawn at random below that range, where only listeners live, and
 * checked by binding it.
 */
import { randomInt } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';

/** Where a drawn port starts: above the registered services most hosts run. */
const LOWEST = 10_000;
/** Ports this process handed out already: never twice, even if the first is not bound yet. */
const handedOut = new Set<number>();

/** The first port of the kernel's ephemeral range; 32768 (Linux's default) if unreadable. */
function ephemeralStart(): number {
  try {
    const first = Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]);
    return Number.isInteger(first) && first > 0 ? first : 32_768;
  } catch {
    return 32_768;
  }
}

/** Whether `port` can be bound on `host` (`null`: every interface) right now. */
function canBind(port: number, host: string | null): Promise<boolean> {
  return new Promise((res) => {
    const srv = createServer();
    srv.unref();
    srv.once('error', () => res(false));
    srv.listen({ port, host: host ?? undefined, exclusive: true }, () => srv.close(() => res(true)));
  });
}

/**
 * Returns a TCP port that was free on `host` a moment ago, drawn at random from below the
 * ephemeral range (another process may still bind it first: rare, and the starter reports it).
 * Falls back to the OS's choice when the ephemeral range starts too low to draw from.
 * @param host the interface: 127.0.0.1 by default, `null` for every interface.
 * @throws Error when 200 draws found no free port.
 */
export async function freePort(host: string | null = '127.0.0.1'): Promise<number> {
  const end = ephemeralStart();
  if (end - LOWEST < 1000) return osPort(host);
  for (let i = 0; i < 200; i++) {
    const port = randomInt(LOWEST, end);
    if (handedOut.has(port) || !(await canBind(port, host))) continue;
    handedOut.add(port);
    return port;
  }
  throw new Error(`no free TCP port found between ${LOWEST} and ${end} on ${host ?? 'every interface'}`);
}

/** A port the OS picks (`listen(0)`), from the ephemeral range. */
function osPort(host: string | null): Promise<number> {
  return new Promise((res, rej) => {
    const srv = createServer();
    srv.unref();
    srv.on('error', rej);
    srv.listen({ port: 0, host: host ?? undefined }, () => {
      const addr = srv.address();
      srv.close(() => (typeof addr === 'object' && addr ? res(addr.port) : rej(new Error('no port'))));
    });
  });
}
