/**
 * Counts a process's TCP connections to one port, from /proc (Linux): the socket inodes of
 * `/proc/<pid>/fd` matched against the connection tables `/proc/<pid>/net/tcp` and `tcp6`.
 */
import { readFileSync, readdirSync, readlinkSync } from 'node:fs';

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
