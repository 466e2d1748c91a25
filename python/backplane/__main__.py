"""python -m backplane: the plugin load report and the devices, like bp-smi."""
import backplane as bp


def main():
    print("plugins:")
    for r in bp.load_report():
        line = f"  {r['path']}: {r['decision']}"
        if r["status"] == "loaded":
            line += f" ({r['name']} {r['version']}, ABI {r['abi']}, {r['device_count']} devices)"
        if r["reason"]:
            line += f" - {r['reason']}"
        print(line)
    print("devices:")
    for d in bp.devices():
        total = d.properties()["total_memory"]
        used = total - d.free_memory() if total else 0
        print(f"  {d}  {d.name}  {used / 2**20:.0f} / {total / 2**20:.0f} MiB  [{d.backend}]")
    print(f"default device: {bp.default_device()}")


if __name__ == "__main__":
    main()
