"""Files on datastores: directories and uploads over vCenter's /folder HTTP interface.

Upstream pitfall: ESXi's /folder PUT does not create missing directories (govc needs
datastore.mkdir first), so uploads make the parent directory themselves.
"""

from __future__ import annotations

import contextlib
import http.client
import urllib.parse
from pathlib import Path

from pyVmomi import vim

from components.vsphere.errors import TaskError, VSphereError
from components.vsphere.inventory import find_datacenter, find_datastore, inventory_path
from components.vsphere.session import _ENDPOINTS, present, wait_for_task


def make_datastore_dir(si: vim.ServiceInstance, datacenter: str, datastore: str, path: str) -> str:
    """mkdir -p ``[datastore] path``; an existing directory is fine. Returns the path."""
    dc = find_datacenter(si, datacenter)
    ds = find_datastore(si, dc, datastore)
    ds_path = f"[{ds.name}] {path.strip('/')}"
    with contextlib.suppress(vim.fault.FileAlreadyExists):
        manager = present(si.RetrieveContent().fileManager, "ServiceContent.fileManager")
        manager.MakeDirectory(name=ds_path, datacenter=dc, createParentDirectories=True)
    return ds_path


def upload_to_datastore(
    si: vim.ServiceInstance,
    datacenter: str,
    datastore: str,
    remote_path: str,
    source: str | Path | bytes,
    timeout_s: float = 3600,
) -> str:
    """PUT a local file (or bytes) to ``[datastore] remote_path``; return that path.

    Uses vCenter's /folder HTTP interface with the SOAP session cookie, over
    the same TLS settings as connect(). The file is streamed, not read into
    memory (ISOs are hundreds of MB).
    """
    endpoint = _ENDPOINTS.get(si._GetStub())
    if endpoint is None:
        raise VSphereError("upload_to_datastore needs a ServiceInstance made by components.vsphere.connect()")
    dc = find_datacenter(si, datacenter)
    ds = find_datastore(si, dc, datastore)
    remote = remote_path.lstrip("/")
    if "/" in remote:
        make_datastore_dir(si, datacenter, datastore, remote.rsplit("/", 1)[0])
    query = urllib.parse.urlencode({"dcPath": inventory_path(si, dc), "dsName": ds.name})
    url = f"/folder/{urllib.parse.quote(remote)}?{query}"
    # The stub's cookie is 'vmware_soap_session="..."; Path=/; ...': only the
    # name=value pair goes back (same as pyvmomi-community-samples' uploader).
    cookie = si._GetStub().cookie.split(";", 1)[0].strip()
    conn = http.client.HTTPSConnection(endpoint.host, endpoint.port, context=endpoint.tls, timeout=timeout_s)
    try:
        if isinstance(source, bytes):
            size = len(source)
            headers = {"Cookie": cookie, "Content-Type": "application/octet-stream", "Content-Length": str(size)}
            conn.request("PUT", url, body=source, headers=headers)
        else:
            size = Path(source).stat().st_size
            headers = {"Cookie": cookie, "Content-Type": "application/octet-stream", "Content-Length": str(size)}
            with open(source, "rb") as fh:
                conn.request("PUT", url, body=fh, headers=headers)
        response = conn.getresponse()
        body = response.read(500).decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as exc:
        raise VSphereError(f"upload to [{ds.name}] {remote} failed: {exc}") from exc
    finally:
        conn.close()
    if response.status not in (200, 201, 204):
        raise VSphereError(
            f"upload to [{ds.name}] {remote} failed: HTTP {response.status} {response.reason} {body}".strip()
        )
    return f"[{ds.name}] {remote}"


def delete_datastore_file(si: vim.ServiceInstance, datacenter: str, ds_path: str, timeout_s: float = 300) -> bool:
    """Delete ``[datastore] path`` (a file or a directory); False when it was not there."""
    dc = find_datacenter(si, datacenter)
    manager = present(si.RetrieveContent().fileManager, "ServiceContent.fileManager")
    try:
        wait_for_task(manager.DeleteDatastoreFile_Task(name=ds_path, datacenter=dc), f"deleting {ds_path}", timeout_s)
    except TaskError as error:
        if isinstance(error.fault, vim.fault.FileNotFound):
            return False
        raise
    return True


def remove_empty_datastore_dir(si: vim.ServiceInstance, datacenter: str, ds_path: str, timeout_s: float = 300) -> bool:
    """Delete the directory ``[datastore] path`` if it holds nothing; True when it was removed.

    DeleteDatastoreFile_Task deletes a directory with everything in it, so it is called only after
    the datastore browser found the directory empty.
    """
    dc = find_datacenter(si, datacenter)
    ds = find_datastore(si, dc, ds_path[1 : ds_path.index("]")])
    # Ask for every entry by name (no query: every kind, folders included): vcsim matches no entry when matchPattern is
    # empty (govmomi simulator/host_datastore_browser.go search), where vCenter matches all, and
    # the directory then looked empty although another stack's upload was in it.
    spec = vim.host.DatastoreBrowser.SearchSpec(matchPattern=["*"])
    search = ds.browser.SearchDatastore_Task(datastorePath=ds_path, searchSpec=spec)
    try:
        result = wait_for_task(search, f"listing {ds_path}", timeout_s)
    except TaskError as error:
        if isinstance(error.fault, vim.fault.FileNotFound):
            return False
        raise
    if result is not None and result.file:
        return False
    return delete_datastore_file(si, datacenter, ds_path, timeout_s)
