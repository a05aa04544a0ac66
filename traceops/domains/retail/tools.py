"""The retail tools: the backend operations an agent may call, as methods over ``self.db``.

Tools check what the backend itself would reject (unknown ids, wrong id format, items not in the
order, out-of-stock variants) and raise ``ValueError``, which ``Environment.call_tool`` turns into an
``Error: ...`` observation. What the *policy* forbids (cancelling a delivered order, late returns,
editing a processed order) is deliberately not checked here: following the policy is the agent's job,
and a forbidden write changes the database, so the verifier sees it.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from traceops.domains.retail.database import CANCEL_REASONS, DB

ORDER_ID = re.compile(r"^#W\d{7}$")
USER_ID = re.compile(r"^user_\d{4}$")


def _dump(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


class RetailTools:
    """Tool methods of the retail environment over ``db``.

    ``db`` starts as a shallow copy of the shared pristine database. Writes go through ``_write_row``
    (or ``_write_table``), which copy a table's index and a row on first write (copy-on-write: the
    pristine data is never mutated, lookups copy nothing) and record the table in ``touched``, the
    tables the verifier compares.
    """

    db: DB
    touched: set[str]
    _copied_rows: dict[str, set[str]]

    def _start(self, db: DB) -> None:
        """Begin an episode on ``db`` (a shallow copy of the pristine database)."""
        self.db = db
        self.touched = set()
        self._copied_rows = {}

    def _write_table(self, table: str) -> Any:
        if table not in self.touched:
            self.db[table] = copy.copy(self.db[table])
            self.touched.add(table)
            self._copied_rows[table] = set()
        return self.db[table]

    def _write_row(self, table: str, key: str) -> dict[str, Any]:
        rows = self._write_table(table)
        if key not in self._copied_rows[table]:
            rows[key] = copy.deepcopy(rows[key])
            self._copied_rows[table].add(key)
        return rows[key]

    # -- lookups (private helpers, not tools) ------------------------------------------------------
    def _order(self, order_id: str) -> dict[str, Any]:
        if not isinstance(order_id, str) or not ORDER_ID.match(order_id):
            raise ValueError(f"invalid order id {order_id!r}: order ids look like '#W0123456' "
                             "('#W' followed by seven digits)")
        order = self.db["orders"].get(order_id)
        if order is None:
            raise ValueError(f"order {order_id} not found")
        return order

    def _user(self, user_id: str) -> dict[str, Any]:
        if not isinstance(user_id, str) or not USER_ID.match(user_id):
            raise ValueError(f"invalid user id {user_id!r}: user ids look like 'user_0042'")
        user = self.db["users"].get(user_id)
        if user is None:
            raise ValueError(f"user {user_id} not found")
        return user

    def _product(self, product_id: str) -> dict[str, Any]:
        product = self.db["products"].get(product_id) if isinstance(product_id, str) else None
        if product is None:
            raise ValueError(f"product {product_id!r} not found; product ids look like 'prod_001'")
        return product

    @staticmethod
    def _text(value: Any, field: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"'{field}' must be a non-empty string")
        return value.strip()

    # -- read tools ---------------------------------------------------------------------------------
    def find_user_by_email(self, email: str) -> str:
        """Find a customer's user id from their email address.

        Args:
            email: The customer's email address, e.g. 'ava.kim12@example.com'.
        """
        wanted = self._text(email, "email").lower()
        for user in self.db["users"].values():
            if user["email"] == wanted:
                return user["user_id"]
        raise ValueError(f"no user with email {email!r}")

    def find_user_by_name_zip(self, first_name: str, last_name: str, zip: str) -> str:
        """Find a customer's user id from their first name, last name and address zip code.

        Args:
            first_name: The customer's first name, e.g. 'Ava'.
            last_name: The customer's last name, e.g. 'Kim'.
            zip: The zip code of the customer's address, e.g. '78701'.
        """
        first = self._text(first_name, "first_name").lower()
        last = self._text(last_name, "last_name").lower()
        code = self._text(zip, "zip")
        for user in self.db["users"].values():
            name = user["name"]
            if (name["first_name"].lower(), name["last_name"].lower(), user["address"]["zip"]) == (
                    first, last, code):
                return user["user_id"]
        raise ValueError(f"no user named {first_name} {last_name} with zip {zip}")

    def get_user_details(self, user_id: str) -> str:
        """Get a customer's profile: name, email, address, payment methods and order ids.

        Args:
            user_id: The user id, e.g. 'user_0042'.
        """
        return _dump(self._user(user_id))

    def list_user_orders(self, user_id: str) -> str:
        """List a customer's orders with their status.

        Args:
            user_id: The user id, e.g. 'user_0042'.
        """
        user = self._user(user_id)
        orders = self.db["orders"]
        return _dump([{"order_id": oid, "status": orders[oid]["status"]} for oid in user["orders"]])

    def get_order_details(self, order_id: str) -> str:
        """Get an order's status, items, address, payment method, total and dates.

        Args:
            order_id: The order id, '#W' followed by seven digits, e.g. '#W0123456'.
        """
        return _dump(self._order(order_id))

    def list_products(self) -> str:
        """List every product's id and name."""
        return _dump({p["name"]: pid for pid, p in self.db["products"].items()})

    def get_product_details(self, product_id: str) -> str:
        """Get a product's variants with their sku, options, price and stock.

        Args:
            product_id: The product id, e.g. 'prod_007'.
        """
        return _dump(self._product(product_id))

    # -- write tools --------------------------------------------------------------------------------
    def cancel_pending_order(self, order_id: str, reason: str) -> str:
        """Cancel an order. Only pending orders may be cancelled (see the policy).

        Args:
            order_id: The order id, e.g. '#W0123456'.
            reason: Why the customer cancels: 'no longer needed' or 'ordered by mistake'.
        """
        order = self._order(order_id)
        if reason not in CANCEL_REASONS:
            raise ValueError(f"reason must be one of {list(CANCEL_REASONS)}, got {reason!r}")
        if order["status"] == "cancelled":
            raise ValueError(f"order {order_id} is already cancelled")
        order = self._write_row("orders", order_id)
        order["status"] = "cancelled"
        order["cancel_reason"] = reason
        order["refunds"].append({"amount": order["total"], "payment_method_id": order["payment_method_id"]})
        return _dump({"order_id": order_id, "status": "cancelled", "refund": order["total"]})

    def modify_pending_order_address(self, order_id: str, address1: str, city: str, state: str,
                                     zip: str) -> str:
        """Change the shipping address of an order. Only pending orders may be modified (see the policy).

        Args:
            order_id: The order id, e.g. '#W0123456'.
            address1: Street address, e.g. '12 Oak St'.
            city: City name.
            state: Two-letter state code, e.g. 'TX'.
            zip: Five-digit zip code.
        """
        self._order(order_id)
        address = self._address(address1, city, state, zip)
        order = self._write_row("orders", order_id)
        order["address"] = address
        return _dump({"order_id": order_id, "address": order["address"]})

    def update_user_address(self, user_id: str, address1: str, city: str, state: str,
                            zip: str) -> str:
        """Change a customer's default address (existing orders keep theirs).

        Args:
            user_id: The user id, e.g. 'user_0042'.
            address1: Street address, e.g. '12 Oak St'.
            city: City name.
            state: Two-letter state code, e.g. 'TX'.
            zip: Five-digit zip code.
        """
        self._user(user_id)
        address = self._address(address1, city, state, zip)
        user = self._write_row("users", user_id)
        user["address"] = address
        return _dump({"user_id": user_id, "address": user["address"]})

    def return_delivered_order_items(self, order_id: str, item_ids: list[str]) -> str:
        """Return items of a delivered order; the refund goes to the order's payment method.

        Args:
            order_id: The order id, e.g. '#W0123456'.
            item_ids: Ids of the items to return, e.g. ['item_0123456_1'].
        """
        self._items(self._order(order_id), item_ids)
        order = self._write_row("orders", order_id)
        items = self._items(order, item_ids)
        for item in items:
            item["state"] = "return requested"
        amount = round(sum(item["price"] for item in items), 2)
        order["refunds"].append({"amount": amount, "payment_method_id": order["payment_method_id"]})
        return _dump({"order_id": order_id, "returned": sorted(item_ids), "refund": amount})

    def exchange_delivered_order_items(self, order_id: str, item_id: str, new_sku: str) -> str:
        """Exchange one item of a delivered order for another variant (sku) of the same product.

        Args:
            order_id: The order id, e.g. '#W0123456'.
            item_id: Id of the item to exchange, e.g. 'item_0123456_1'.
            new_sku: Sku of the new variant of the same product, e.g. 'sku_01012'.
        """
        order = self._order(order_id)
        (item,) = self._items(order, [item_id])
        variants = self.db["products"][item["product_id"]]["variants"]
        if new_sku not in variants:
            raise ValueError(f"sku {new_sku!r} is not a variant of {item['name']} ({item['product_id']})")
        if new_sku == item["sku"]:
            raise ValueError(f"item {item_id} already is variant {new_sku}")
        variant = variants[new_sku]
        if variant["stock"] <= 0:
            raise ValueError(f"variant {new_sku} of {item['name']} is out of stock")
        self._write_row("products", item["product_id"])["variants"][new_sku]["stock"] -= 1
        item = next(i for i in self._write_row("orders", order_id)["items"] if i["item_id"] == item_id)
        item["state"] = "exchange requested"
        item["exchange_sku"] = new_sku
        difference = round(variant["price"] - item["price"], 2)
        return _dump({"order_id": order_id, "item_id": item_id, "new_sku": new_sku,
                      "price_difference": difference})

    def transfer_to_human_agents(self, summary: str) -> str:
        """Transfer the customer to a human agent, with a short summary of their issue.

        Args:
            summary: One or two sentences describing the customer's issue.
        """
        self._text(summary, "summary")
        # The summary's wording is free, so only the fact of a transfer is part of the verified state.
        self._write_table("tickets").append({"kind": "transfer"})
        return "Transfer successful: a human agent will take over this conversation."

    # -- validation helpers -------------------------------------------------------------------------
    def _address(self, address1: str, city: str, state: str, zip: str) -> dict[str, str]:
        address = {"address1": self._text(address1, "address1"), "city": self._text(city, "city"),
                   "state": self._text(state, "state"), "zip": self._text(zip, "zip")}
        if not re.fullmatch(r"\d{5}", address["zip"]):
            raise ValueError(f"zip must be five digits, got {zip!r}")
        return address

    @staticmethod
    def _items(order: dict[str, Any], item_ids: list[str]) -> list[dict[str, Any]]:
        if not isinstance(item_ids, list) or not item_ids:
            raise ValueError("item_ids must be a non-empty list of item ids")
        by_id = {item["item_id"]: item for item in order["items"]}
        missing = [i for i in item_ids if i not in by_id]
        if missing:
            raise ValueError(f"items {missing} are not in order {order['order_id']}")
        if len(set(item_ids)) != len(item_ids):
            raise ValueError("item_ids lists an item twice")
        taken = [i for i in item_ids if by_id[i]["state"] != "ordered"]
        if taken:
            raise ValueError(f"items {taken} already have a return or exchange requested")
        return [by_id[i] for i in item_ids]
